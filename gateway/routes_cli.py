"""``openengine-gateway routes``: show a running gateway's splits and mirrors, or reload them.

    openengine-gateway routes --target HOST:PORT [--reload | --canary SPLIT ACTION] [--token T] [--ca FILE | --tls]

``--reload`` asks the gateway to re-read its configuration file (``ReloadRoutes``, a control
token's call) and prints what changed, then the routes; a refused reload prints the gateway's
reason. The same reload as SIGHUP to the gateway's process, for an operator on another machine.
``--canary SPLIT ACTION`` pauses, resumes, promotes or aborts a split's canary (``ControlCanary``,
a control token's call). A split's canary is printed under it, with the evidence of each decision.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import grpc

from . import routes_pb
from .client import ClientError, OpenEngineClient, StatusError
from .client.connection_options import add_connection_options, connect_options

ACTIONS = {
    "pause": routes_pb.CANARY_ACTION_PAUSE,
    "resume": routes_pb.CANARY_ACTION_RESUME,
    "promote": routes_pb.CANARY_ACTION_PROMOTE,
    "abort": routes_pb.CANARY_ACTION_ABORT,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openengine-gateway routes",
        description="Show a running gateway's splits and mirrors; with --reload, first reload them from the "
        "configuration file it was started with (as SIGHUP does) and say what changed.",
        epilog="exit status: 0, 1 when the gateway refused (a reload of a file that does not validate, or a token "
        "without the control scope), 2 on a usage error or when the gateway cannot be reached.",
    )
    parser.add_argument("--target", required=True, help="host:port of the gateway")
    parser.add_argument("--reload", action="store_true", help="reload the routes first (needs a control token)")
    parser.add_argument(
        "--canary",
        nargs=2,
        metavar=("SPLIT", "ACTION"),
        help="pause, resume, promote or abort the canary of SPLIT (needs a control token)",
    )
    add_connection_options(parser)
    return parser


def render(routes: routes_pb.RouteTable) -> str:
    """The routes as an operator reads them: each split's engines with weight and share, each mirror."""
    if not routes.splits and not routes.mirrors:
        return "no splits or mirrors: every name is served by its own engine"
    lines = []
    for split in routes.splits:
        aliases = f" (aliases {', '.join(split.aliases)})" if split.aliases else ""
        lines.append(f"split {split.name}{aliases}, sticky by {', '.join(split.sticky) or 'nothing'}")
        total = sum(engine.weight for engine in split.engines) or 1
        width = max((len(engine.engine) for engine in split.engines), default=0)
        for engine in split.engines:
            lines.append(f"  {engine.engine:<{width}}  weight {engine.weight:>4}  {100 * engine.weight / total:5.1f}%")
        if split.HasField("canary"):
            lines.extend(_canary(split.canary))
    for mirror in routes.mirrors:
        lines.append(
            f"mirror {mirror.name} -> {mirror.shadow}: {mirror.percent:g}% of requests, "
            f"at most {mirror.max_in_flight} in flight"
        )
    return "\n".join(lines)


def _canary(canary: routes_pb.Canary) -> list[str]:
    steps = ", ".join(f"[{s}]" if i + 1 == canary.step else str(s) for i, s in enumerate(canary.steps))
    lines = [
        f"  canary {canary.state}: {canary.candidate} against {canary.baseline} at {canary.weight}%, steps {steps}"
    ]
    lines.extend(f"    {line}" for line in canary.evidence)
    return lines


async def _run(args: argparse.Namespace) -> int:
    client = await OpenEngineClient.connect(args.target, **connect_options(args), check_compatibility=False)
    async with client:
        stub = routes_pb.RoutesStub(client.channel)
        try:
            if args.canary is not None:
                split, action = args.canary
                request = routes_pb.ControlCanaryRequest(split=split, action=ACTIONS[action])
                routes = await stub.ControlCanary(request, metadata=client.call_metadata, timeout=30)
            elif args.reload:
                reloaded = await stub.ReloadRoutes(
                    routes_pb.ReloadRoutesRequest(), metadata=client.call_metadata, timeout=30
                )
                changes = reloaded.changes or ["no change"]
                print("reloaded:\n" + "\n".join(f"  {line}" for line in changes))
                routes = reloaded.routes
            else:
                routes = await stub.GetRoutes(routes_pb.GetRoutesRequest(), metadata=client.call_metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            raise StatusError.from_rpc_error(error) from None
    print(render(routes))
    return 0


def main(argv: Sequence[str]) -> int:
    """Entry point of the ``routes`` subcommand."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.canary is not None and args.canary[1] not in ACTIONS:
        parser.error(f"--canary SPLIT ACTION: ACTION is one of {', '.join(ACTIONS)}, not {args.canary[1]!r}")
    if args.canary is not None and args.reload:
        parser.error("--canary and --reload are two calls: run them one after the other")
    try:
        return asyncio.run(_run(args))
    except StatusError as exc:
        print(f"openengine-gateway routes: {exc}", file=sys.stderr)
        unreachable = exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        return 2 if unreachable else 1
    except (ClientError, OSError) as exc:  # OSError: an unreadable --ca
        print(f"openengine-gateway routes: {exc}", file=sys.stderr)
        return 2


__all__ = ["main", "render"]
