"""The gateway's own ``openengine_gateway.v1.Routes`` service: the routes served, and their reload.

``ReloadRoutes`` is the same reload as SIGHUP (``reload``), by the call's caller; a refused reload
is FAILED_PRECONDITION with the reason: the request has no argument to blame, the file does.
"""

from __future__ import annotations

from .. import routes_pb
from ..core.callers import current_caller
from ..errors import ConfigurationError, FailedPrecondition
from ..reload import RouteReloader, RouteSections
from .servicer import Context, unary


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
        return await unary(context, lambda _request: route_table(self._reloader.gateway.routes), request)

    async def ReloadRoutes(
        self, request: routes_pb.ReloadRoutesRequest, context: Context
    ) -> routes_pb.ReloadRoutesResponse:
        return await unary(context, self._reload, request)

    def _reload(self, _request: routes_pb.ReloadRoutesRequest) -> routes_pb.ReloadRoutesResponse:
        try:
            reloaded = self._reloader.reload(current_caller())
        except ConfigurationError as exc:
            raise FailedPrecondition(f"routes not reloaded: {exc}") from None
        return routes_pb.ReloadRoutesResponse(routes=route_table(reloaded.routes), changes=reloaded.changes)


__all__ = ["RoutesServicer", "route_table"]
