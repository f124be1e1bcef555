"""``openengine-gateway routes``: show a running gateway's splits and mirrors, or reload them.

    openengine-gateway routes --target HOST:PORT [--reload] [--token T] [--ca FILE | --tls]

``--reload`` asks the gateway to re-read its configuration file (``ReloadRoutes``, a control
token's call) and prints what changed, then the routes; a refused reload prints the gateway's
reason. The same reload as SIGHUP to the gateway's process, for an operator on another machine.
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
    for mirror in routes.mirrors:
        lines.append(
            f"mirror {mirror.name} -> {mirror.shadow}: {mirror.percent:g}% of requests, "
            f"at most {mirror.max_in_flight} in flight"
        )
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> int:
    client = await OpenEngineClient.connect(args.target, **connect_options(args), check_compatibility=False)
    async with client:
        stub = routes_pb.RoutesStub(client.channel)
        try:
            if args.reload:
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
    args = _parser().parse_args(argv)
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
