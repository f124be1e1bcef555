"""The gateway's own ``openengine_gateway.v1.Routes`` service: the routes served, and their reload.

``ReloadRoutes`` is the same reload as SIGHUP (``reload``), by the call's caller; a refused reload
is FAILED_PRECONDITION with the reason: the request has no argument to blame, the file does.
"""

from __future__ import annotations

import logging

import grpc

from .. import routes_pb
from ..core.callers import current_caller
from ..errors import ConfigurationError, FailedPrecondition
from ..reload import RouteReloader, RouteSections
from .servicer import Context, reject

log = logging.getLogger(__name__)


def route_table(routes: RouteSections) -> routes_pb.RouteTable:
    """``routes`` as the message: splits with their weights and sticky sources, mirrors with their shadows."""
    return routes_pb.RouteTable(
        splits=[
            routes_pb.Split(
                name=split.name,
                aliases=split.aliases,
                engines=[routes_pb.SplitEngine(engine=name, weight=weight) for name, weight in split.engines.items()],
                sticky=split.sticky,
            )
            for split in routes.splits
        ],
        mirrors=[
            routes_pb.Mirror(
                name=mirror.name, shadow=mirror.shadow, percent=mirror.percent, max_in_flight=mirror.max_in_flight
            )
            for mirror in routes.mirrors
        ],
    )


class RoutesServicer(routes_pb.RoutesServicer):
    """Serves the routes of ``reloader``'s gateway, and reloads them."""

    def __init__(self, reloader: RouteReloader) -> None:
        self._reloader = reloader

    async def GetRoutes(self, request: routes_pb.GetRoutesRequest, context: Context) -> routes_pb.RouteTable:
        return route_table(self._reloader.gateway.routes)

    async def ReloadRoutes(
        self, request: routes_pb.ReloadRoutesRequest, context: Context
    ) -> routes_pb.ReloadRoutesResponse:
        try:
            reloaded = self._reloader.reload(current_caller())
        except ConfigurationError as exc:
            await reject(context, FailedPrecondition(f"routes not reloaded: {exc}"))
            raise AssertionError("unreachable") from None
        except Exception:  # broad on purpose: a bug must be INTERNAL with a message, not UNKNOWN
            log.exception("unexpected failure reloading the routes")
            await context.abort(grpc.StatusCode.INTERNAL, "internal gateway error")
            raise
        return routes_pb.ReloadRoutesResponse(routes=route_table(reloaded.routes), changes=reloaded.changes)


__all__ = ["RoutesServicer", "route_table"]
