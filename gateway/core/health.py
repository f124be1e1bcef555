"""An engine's health as the gateway reads it: its own checks, bounded in time, and their worst state.

Shared by Health (``core.lifecycle``) and the background poll (``core.monitor``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from .. import pb
from ..engines import Engine
from ..spi.results import HealthCheck
from .driver_faults import kind

_SEVERITY = {
    pb.HEALTH_STATE_READY: 0,
    pb.HEALTH_STATE_DEGRADED: 1,
    pb.HEALTH_STATE_STARTING: 2,
    pb.HEALTH_STATE_NOT_READY: 3,
}


def worst(states: Iterable[pb.HealthState.ValueType]) -> pb.HealthState.ValueType:
    """The overall state of a set of checks: the least ready one."""
    return max(states, key=lambda s: _SEVERITY.get(s, 3), default=pb.HEALTH_STATE_READY)


CHECK_TIMEOUT_S = 10.0
"""A health check that takes longer than this reports the engine NOT_READY."""


async def engine_checks(engine: Engine) -> list[HealthCheck]:
    """The engine's own checks, or one NOT_READY check when checking raised or hung.

    Drivers are asked to raise nothing, but one that does (or a wedged engine) must read as
    that engine being unready, not fail the Health of every engine behind the endpoint.
    """
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):  # not wait_for: on 3.11 it can swallow a cancel
            checks = list(await engine.backend.check_health())
    except TimeoutError:
        message = f"health check took longer than {CHECK_TIMEOUT_S:g}s"
    except Exception as exc:  # broad on purpose: a check that raises reports a broken engine
        message = f"health check failed: {type(exc).__name__}: {exc}"
    else:
        wrong = next((check for check in checks if not isinstance(check, HealthCheck)), None)
        if wrong is None:
            return checks
        message = engine.faults.record(f"check_health returned a {kind(wrong)}, not an spi.HealthCheck")
    return [HealthCheck("engine", pb.HEALTH_STATE_NOT_READY, message)]


__all__ = ["CHECK_TIMEOUT_S", "engine_checks", "worst"]
