"""``openengine-gateway bench``: one seeded workload against one or more OpenEngine targets.

    openengine-gateway bench --target 127.0.0.1:50051/tiny-llama --target host:50051/model-b \\
        --num-requests 200 --concurrency 8 --prompt-len 64:256 --output-len 128 \\
        --json bench.json --report bench-report/
    openengine-gateway bench --live http://127.0.0.1:9100/metrics [--window 60] [--report DIR]

``--live`` measures nothing itself: it summarises a running gateway's mirrors (see ``live``).
Targets are measured one after another with the same requests (see ``runner``). Exit status 0,
1 when a target finished no request, 2 on a usage, connection or report error, 130 when
interrupted. A first Ctrl-C stops the run and still reports (table, JSON, plots) what was measured
up to then; a second one quits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ..client import ClientError
from ..client.connection_options import add_connection_options, add_layout_option, connect_options
from . import live
from .errors import BenchError, ReportError
from .plots import caption, prepare_directory, require_matplotlib, write_plots
from .prompts import load_prompts
from .records import Target, distinct
from .report import to_json, to_text
from .runner import Connection, RunOptions, benchmark
from .stats import compare
from .workload import Lengths, Workload, WorkloadSpec

T = TypeVar("T")

DEFAULT_REQUESTS = 100
"""Requests per target when neither a count nor a duration is given."""
INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), partial results reported or not."""


def _typed(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` for argparse, with its ``ValueError`` message shown as the usage error."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def _bounded(rule: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """A number flag's parser: a value ``accept`` takes (never NaN), else an error stating ``rule``."""

    def parse(text: str) -> float:
        value = float(text)
        if math.isnan(value) or not accept(value):
            raise ValueError(f"{rule}, not {text!r}")
        return value

    return parse


_seconds = _bounded("a time is a positive number of seconds", lambda value: 0 < value < math.inf)
_rate = _bounded("a request rate is a positive number of requests/s or 'inf'", lambda value: value > 0)
_temperature = _bounded("a temperature is a number >= 0", lambda value: 0 <= value < math.inf)
_burstiness = _bounded("burstiness is a positive number", lambda value: 0 < value < math.inf)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openengine-gateway bench",
        description="Benchmark OpenEngine endpoints with one seeded workload, target after target.",
    )
    parser.add_argument(
        "--target",
        action="append",
        type=_typed(Target.parse),
        metavar="HOST:PORT/MODEL",
        help="HOST:PORT/MODEL (or HOST:PORT for the server's only model); repeat to compare",
    )
    load = parser.add_argument_group("load (the run ends at whichever bound comes first)")
    load.add_argument(
        "--num-requests", type=int, metavar="N", help=f"measured requests per target (default {DEFAULT_REQUESTS})"
    )
    load.add_argument("--duration", type=_typed(_seconds), metavar="S", help="seconds per target to keep sending")
    load.add_argument(
        "--concurrency", type=int, metavar="N", help="requests in flight (default 1); with --request-rate, a cap"
    )
    load.add_argument(
        "--request-rate", type=_typed(_rate), metavar="R", help="requests/s with gamma arrivals ('inf': all at once)"
    )
    load.add_argument(
        "--burstiness",
        type=_typed(_burstiness),
        metavar="B",
        help="gamma shape of --request-rate arrivals (default 1: Poisson)",
    )
    load.add_argument(
        "--warmup", type=int, metavar="N", default=2, help="unmeasured requests before each target (default 2)"
    )
    load.add_argument(
        "--timeout", type=_typed(_seconds), metavar="S", default=300.0, help="seconds per request (default 300)"
    )
    work = parser.add_argument_group("workload")
    work.add_argument("--seed", type=int, default=0, help="seed of prompts, lengths and arrivals (default 0)")
    work.add_argument(
        "--prompt-len",
        type=_typed(Lengths.parse),
        metavar="N|LOW:HIGH",
        default=Lengths(128, 128),
        help="N or LOW:HIGH (inclusive) characters, or token ids with --vocab-size (default 128)",
    )
    work.add_argument(
        "--output-len",
        type=_typed(Lengths.parse),
        metavar="N|LOW:HIGH",
        default=Lengths(64, 64),
        help="N or LOW:HIGH (inclusive) tokens (default 64)",
    )
    work.add_argument(
        "--prompts-file",
        type=Path,
        metavar="FILE",
        help='prompts: JSONL {"prompt", "output_len"?}, a .json array of those, or text lines',
    )
    work.add_argument("--prefix-groups", type=int, metavar="N", default=0, help="groups of prompts sharing a prefix")
    work.add_argument(
        "--prefix-len", type=int, metavar="L", default=0, help="each group's shared prefix, in --prompt-len's unit"
    )
    work.add_argument("--vocab-size", type=int, metavar="V", help="send random token ids below this instead of text")
    work.add_argument(
        "--temperature", type=_typed(_temperature), default=0.0, help="0 (default) is greedy: agreement is reported"
    )
    work.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly the output length (default on)",
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--json", type=Path, metavar="FILE", help="write the results as JSON to this file ('-' for stdout)"
    )
    output.add_argument(
        "--report", type=Path, metavar="DIR", help="write PNG plots into this directory (needs matplotlib)"
    )
    output.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_layout_option(parser)
    add_connection_options(parser)
    live.add_live_options(parser)
    return parser


def _workload(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        seed=args.seed,
        prompt_lengths=args.prompt_len,
        output_lengths=args.output_len,
        prefix_groups=args.prefix_groups,
        prefix_length=args.prefix_len,
        vocab_size=args.vocab_size,
        prompts=load_prompts(args.prompts_file) if args.prompts_file else (),
        request_rate=args.request_rate,
        burstiness=1.0 if args.burstiness is None else args.burstiness,
    )


def _options(args: argparse.Namespace) -> RunOptions:
    bounded = args.num_requests is not None or args.duration is not None
    return RunOptions(
        concurrency=args.concurrency if args.concurrency is not None or args.request_rate else 1,
        num_requests=args.num_requests if bounded else DEFAULT_REQUESTS,
        duration_s=args.duration,
        warmup=args.warmup,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        timeout_s=args.timeout,
    )


def _describe(spec: WorkloadSpec, options: RunOptions) -> str:
    """The workload in one line, for the head of the table."""
    if spec.request_rate is None:
        load = f"concurrency {options.concurrency}"
    else:
        cap = f", at most {options.concurrency} in flight" if options.concurrency else ""
        load = f"{spec.request_rate:g} requests/s (burstiness {spec.burstiness:g}){cap}"
    bounds = [f"{options.num_requests} requests"] if options.num_requests is not None else []
    bounds += [f"{options.duration_s:g}s"] if options.duration_s is not None else []
    unit = "tokens" if spec.vocab_size is not None else "chars"
    prompts = f"{len(spec.prompts)} file prompts" if spec.prompts else f"prompt {spec.prompt_lengths} {unit}"
    prefix = f", {spec.prefix_groups} groups sharing {spec.prefix_length} {unit}" if spec.prefix_groups else ""
    output = f"output {spec.output_lengths} tokens"
    if spec.prompts:
        output += " where the file gives none"
    return (
        f"{load}, {' or '.join(bounds)} per target, {prompts}{prefix}, {output}, "
        f"temperature {options.temperature:g}, seed {spec.seed}"
    )


def _settings(
    targets: Sequence[Target], spec: WorkloadSpec, options: RunOptions, prompts: Path | None, layout: str
) -> dict[str, Any]:
    workload = {k: v for k, v in dataclasses.asdict(spec).items() if k != "prompts"}
    return {
        "targets": [t.label for t in targets],
        "layout": layout,
        **workload,
        "prompts_file": str(prompts) if prompts else None,
        **dataclasses.asdict(options),
    }


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Where results go must be usable before anything is measured: a run is too dear to lose."""
    if args.json is not None and str(args.json) != "-":
        folder = args.json.parent
        if args.json.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
            parser.error(f"--json {args.json}: not a file in a writable directory")
    if args.report is not None:
        try:
            prepare_directory(args.report)
        except ReportError as error:
            parser.error(f"--report {args.report}: {error}")


async def run(argv: Sequence[str]) -> int:
    """The subcommand inside a running event loop (``main`` runs it; tests await it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.live is not None:
        return await live.run(list(argv))
    if args.target is None:
        parser.error("give --target HOST:PORT/MODEL (or --live METRICS_URL)")
    if args.window is not None or args.metrics_ca is not None:
        parser.error("--window and --metrics-ca go with --live")
    if args.baseline is not None:
        parser.error("--baseline goes with --live")
    try:
        spec, options = _workload(args), _options(args)
    except ValueError as error:
        parser.error(str(error))
    if args.burstiness is not None and spec.request_rate is None:
        parser.error("--burstiness shapes the arrivals of --request-rate: give one")
    if spec.request_rate == math.inf and options.num_requests is None and options.concurrency is None:
        parser.error("at an infinite request rate, bound the run with --num-requests or cap it with --concurrency")
    if args.report is not None:
        require_matplotlib()
    _check_outputs(parser, args)
    targets = distinct(args.target)
    connection = Connection(**connect_options(args), layout=args.layout)
    stop = asyncio.Event()
    started = datetime.now(UTC)
    with _stop_on_interrupt(stop):
        runs = await benchmark(
            targets,
            Workload(spec),
            options,
            connection,
            progress=not args.no_progress and sys.stderr.isatty(),
            stop=stop,
        )
    if not runs:
        print("openengine-gateway bench: interrupted before any target was measured", file=sys.stderr)
        return INTERRUPTED
    if stop.is_set() and len(runs) < len(targets):
        skipped = ", ".join(t.label for t in targets[len(runs) :])
        print(f"openengine-gateway bench: interrupted; not measured: {skipped}", file=sys.stderr)
    comparison = compare(runs, greedy=options.temperature == 0.0)
    json_to_stdout = args.json is not None and str(args.json) == "-"
    if args.json is not None:
        text = to_json(comparison, runs, _settings(targets, spec, options, args.prompts_file, args.layout))
        if json_to_stdout:
            print(text)
        else:
            args.json.write_text(text + "\n")
    if not json_to_stdout:
        print(f"OpenEngine benchmark: {_describe(spec, options)}")
        print(to_text(comparison))
    if args.report is not None:
        written = write_plots(runs, args.report, caption(runs, _describe(spec, options), started))
        where = sys.stderr if json_to_stdout else sys.stdout
        print(f"report: {', '.join(p.name for p in written)} in {args.report}", file=where)
    if stop.is_set():
        return INTERRUPTED
    return 1 if any(s.completed == 0 for s in comparison.summaries) else 0


@contextlib.contextmanager
def _stop_on_interrupt(stop: asyncio.Event) -> Iterator[None]:
    """A first SIGINT sets ``stop`` (the run ends and reports what it measured); a second one, back
    with Python's own handler, raises ``KeyboardInterrupt`` and quits. Where the loop cannot take
    signals (not the main thread, Windows), SIGINT keeps quitting at once."""
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        print("\ninterrupted: reporting what was measured (Ctrl-C again to quit)", file=sys.stderr)

    try:
        loop.add_signal_handler(signal.SIGINT, interrupted)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def main(argv: Sequence[str]) -> int:
    """Entry point of the ``bench`` subcommand."""
    try:
        return asyncio.run(run(argv))
    except (BenchError, ClientError, OSError) as error:
        print(f"openengine-gateway bench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("openengine-gateway bench: interrupted", file=sys.stderr)
        return INTERRUPTED


__all__ = ["DEFAULT_REQUESTS", "main", "run"]
