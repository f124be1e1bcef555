"""``openengine-gateway conformance``: check any OpenEngine endpoint against the contract."""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import sys
from collections.abc import Sequence
from pathlib import Path

from ..client import ClientError, OpenEngineClient
from ..client.connection_options import add_connection_options, add_layout_option, connect_options
from .kit import Outcome, Target, all_rules, run_rules
from .report import to_json, to_text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openengine-gateway conformance",
        description="Run the OpenEngine v1 contract checks against an endpoint.",
        epilog="exit status: 0 when no rule failed (skipped rules are ones the model does not advertise), "
        "1 when a rule failed, 2 on a usage error or when the target cannot be reached.",
    )
    parser.add_argument("--target", required=True, help="host:port of the OpenEngine server")
    parser.add_argument("--model", default="", help="model to check (default: the first supported model)")
    parser.add_argument("--rule", action="append", default=[], help="only rules matching this glob (repeatable)")
    parser.add_argument("--include-disruptive", action="store_true", help="also run checks that drain the server")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file ('-' for stdout)")
    parser.add_argument("--timeout", type=_positive, default=60.0, help="seconds per rule")
    add_layout_option(parser)
    add_connection_options(parser)
    return parser


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


async def _run(args: argparse.Namespace) -> int:
    rules = all_rules(include_disruptive=args.include_disruptive)
    if args.rule:
        rules = [r for r in rules if any(fnmatch.fnmatch(r.id, pattern) for pattern in args.rule)]
        if not rules:
            raise ClientError(f"no rule matches {' '.join(args.rule)}")
    options = connect_options(args)
    client = await OpenEngineClient.connect(args.target, **options, layout=args.layout, check_compatibility=False)
    async with client:
        target = await Target.open(client, args.model, timeout_s=args.timeout)
        results = await run_rules(target, rules)
    if args.json is None or str(args.json) != "-":
        print(to_text(results, args.target))
    if args.json is not None:
        text = to_json(results, args.target)
        if str(args.json) == "-":
            print(text)
        else:
            args.json.write_text(text + "\n")
    return 1 if any(r.outcome is Outcome.FAILED for r in results) else 0


def main(argv: Sequence[str]) -> int:
    """Entry point of the ``conformance`` subcommand."""
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (ClientError, OSError) as exc:  # OSError: an unreadable --ca, an unwritable --json
        print(f"openengine-gateway conformance: {exc}", file=sys.stderr)
        return 2


__all__ = ["main"]
