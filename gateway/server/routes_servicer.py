"""The gateway's own ``openengine_gateway.v1.Routes`` service: the routes served, and their reload.

``ReloadRoutes`` is the same reload as SIGHUP (``reload``), by the call's caller; a refused reload
is FAILED_PRECONDITION with the reason: the request has no argument to blame, the file does. Behind
``--frontends`` it reloads every frontend process (``core.peers``), where SIGHUP reaches each already.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import routes_pb
from ..core.callers import current_caller
from ..core.canary import Canary
from ..core.gateway import Gateway
from ..core.peers import Siblings
from ..errors import ConfigurationError, FailedPrecondition, InvalidArgument, RequestError
from ..reload import Reloaded, RouteReloader, RouteSections
from .servicer import Context, unary

ACTIONS = {
    routes_pb.CANARY_ACTION_PAUSE: "pause",
    routes_pb.CANARY_ACTION_RESUME: "resume",
    routes_pb.CANARY_ACTION_PROMOTE: "promote",
    routes_pb.CANARY_ACTION_ABORT: "abort",
}


def route_table(routes: RouteSections, canaries: Mapping[str, Canary] | None = None) -> routes_pb.RouteTable:
    """``routes`` as the message: splits with their weights, sticky sources and canaries, mirrors with their
    shadows."""
    canaries = canaries or {}
    return routes_pb.RouteTable(
        splits=[
            routes_pb.Split(
                name=split.name,
                aliases=split.aliases,
                engines=[routes_pb.SplitEngine(engine=name, weight=weight) for name, weight in split.engines.items()],
                sticky=split.sticky,
                canary=_canary(canaries[split.name]) if split.name in canaries else None,
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


def _canary(canary: Canary) -> routes_pb.Canary:
    return routes_pb.Canary(
        baseline=canary.baseline,
        candidate=canary.candidate,
        steps=canary.section.steps,
        step=canary.step + 1,
        weight=canary.weight,
        state=canary.state,
        evidence=canary.evidence,
    )


def reload_routes(reloader: RouteReloader) -> Reloaded:
    """This process's reload, by the current caller; a refusal as FAILED_PRECONDITION."""
    try:
        return reloader.reload(current_caller())
    except ConfigurationError as exc:
        raise FailedPrecondition(f"routes not reloaded: {exc}") from None


class RoutesServicer(routes_pb.RoutesServicer):
    """Serves the routes of ``reloader``'s gateway, and reloads them (and the ``siblings``' routes)."""

    def __init__(
        self, reloader: RouteReloader, siblings: Siblings | None = None, *, gateway: Gateway | None = None
    ) -> None:
        """``gateway``: the gateway whose canaries are shown and controlled (none without it)."""
        self._reloader = reloader
        self._siblings = siblings
        self._gateway = gateway

    def _table(self, routes: RouteSections) -> routes_pb.RouteTable:
        return route_table(routes, self._gateway.canaries.running if self._gateway is not None else None)

    async def GetRoutes(self, request: routes_pb.GetRoutesRequest, context: Context) -> routes_pb.RouteTable:
        return await unary(context, lambda _request: self._table(self._reloader.gateway.routes), request)

    async def ControlCanary(self, request: routes_pb.ControlCanaryRequest, context: Context) -> routes_pb.RouteTable:
        return await unary(context, self.control_canary, request)

    def control_canary(self, request: routes_pb.ControlCanaryRequest) -> routes_pb.RouteTable:
        """The action on the split's canary; INVALID_ARGUMENT without one."""
        action = ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgument(f"action must be one of {', '.join(routes_pb.CanaryAction.keys()[1:])}")
        if self._gateway is None:
            raise FailedPrecondition("this server runs no canaries")
        return self._table(self._gateway.control_canary(request.split, action))

    async def ReloadRoutes(
        self, request: routes_pb.ReloadRoutesRequest, context: Context
    ) -> routes_pb.ReloadRoutesResponse:
        return await unary(context, self.reload, request)

    async def reload(self, _request: routes_pb.ReloadRoutesRequest) -> routes_pb.ReloadRoutesResponse:
        """Reload here, then in every sibling; a sibling's refusal is this call's error, saying so."""
        reloaded = reload_routes(self._reloader)
        if self._siblings is not None:
            try:
                await self._siblings.reload_routes()
            except RequestError as error:  # the same kind of error, saying where the routes did change
                message = f"routes reloaded in {self._siblings.here}, not in every frontend: {error.message}"
                raise type(error)(message, retry_after_ms=error.retry_after_ms) from None
        return routes_pb.ReloadRoutesResponse(routes=self._table(reloaded.routes), changes=reloaded.changes)


__all__ = ["RoutesServicer", "reload_routes", "route_table"]
