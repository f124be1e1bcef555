"""Engine health and load, polled in the background so requests never wait on a check.

Admission reads the cached readiness (``GatewayState.check_engine``), the grpc.health.v1
mirror reads the overall state, and the metrics exporter reads health and load; none of
them calls an engine per request or per scrape. When an engine turns NOT_READY (its
process died, its check failed or hung) the monitor marks it down, so new requests get
UNAVAILABLE, and ends its in-flight requests with a retryable ``EngineFailure``: a driver
that already failed them is unaffected, and one that would wait forever is not left
waiting. When the engine reports ready again it is admitted again and the recovery logged.
"""

from __future__ import annotations

import asyncio
import logging

from .. import pb
from ..engines import Engine, EngineSet
from ..errors import EngineFailure
from ..spi.results import Load
from .health import CHECK_TIMEOUT_S, engine_checks, worst
from .registry import RequestRegistry
from .state import GatewayState

log = logging.getLogger(__name__)


class EngineMonitor:
    """The latest health state and load of every engine, refreshed every ``interval_s``."""

    def __init__(
        self, engines: EngineSet, registry: RequestRegistry, state: GatewayState, *, interval_s: float = 1.0
    ) -> None:
        self._engines = engines
        self._registry = registry
        self._state = state
        self._interval = interval_s
        self.health: dict[str, pb.HealthState.ValueType] = {
            engine.served_name: pb.HEALTH_STATE_STARTING for engine in engines
        }
        """Served name → ``HealthState`` of the engine's last check (STARTING until the first)."""
        self.load: dict[str, Load] = {}
        """Served name → the engine's last load snapshot (absent until one succeeds)."""
        self.polls = 0

    @property
    def overall(self) -> int:
        """The least ready engine state (draining and starting are the gateway's, not here)."""
        return worst(self.health.values())

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll()
            await asyncio.sleep(self._interval)

    async def poll(self) -> None:
        """Check every engine once and act on transitions."""
        for engine in self._engines:
            state, message = await _check(engine)
            previous = self.health.get(engine.served_name, pb.HEALTH_STATE_READY)
            self.health[engine.served_name] = state
            if state == pb.HEALTH_STATE_NOT_READY and previous != pb.HEALTH_STATE_NOT_READY:
                self._down(engine, message)
            elif state != pb.HEALTH_STATE_NOT_READY and previous == pb.HEALTH_STATE_NOT_READY:
                self._state.engines_down.pop(engine.served_name, None)
                log.warning("engine %r recovered (%s)", engine.served_name, pb.HealthState.Name(state))
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    self.load[engine.served_name] = await engine.backend.load()
            except Exception:  # broad on purpose: load is informational; health covers a broken engine
                log.debug("load of %r unavailable", engine.served_name, exc_info=True)
        self.polls += 1

    def _down(self, engine: Engine, message: str) -> None:
        self._state.engines_down[engine.served_name] = message
        victims = [active for active in self._registry.in_flight() if active.model == engine.served_name]
        log.error(
            "engine %r is not ready (%s); failing its %d in-flight requests", engine.served_name, message, len(victims)
        )
        failure = EngineFailure(
            pb.ERROR_CODE_INTERNAL,
            f"the engine serving {engine.served_name!r} is not ready: {message}",
            retryable=True,
            retry_after_ms=1000,
        )
        for active in victims:
            active.fail(failure)


async def _check(engine: Engine) -> tuple[pb.HealthState.ValueType, str]:
    """The engine's overall state and the message of its least ready check."""
    checks = await engine_checks(engine)
    state = worst([check.state for check in checks])
    messages = [f"{check.name}: {check.message}" for check in checks if check.state == state]
    return state, "; ".join(messages) or pb.HealthState.Name(state)


__all__ = ["EngineMonitor"]
