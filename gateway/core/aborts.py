"""Telling a driver to abort a request, and freeing the request's id only once it has.

Drivers find their requests by id. Were the id free while the driver's abort is still pending,
a new request reusing it would be admitted, and the pending abort would end the new request
while the old one kept running. So a request that did not finish on its own keeps its id (and
its in-flight slot) until its driver has aborted it, for at most ``ENGINE_ABORT_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging

from ..engines import Engine
from .background import BackgroundTasks
from .registry import ActiveRequest, RequestRegistry

log = logging.getLogger(__name__)

ENGINE_ABORT_TIMEOUT_S = 30.0
"""How long a driver's abort may take before the id is freed anyway (with a warning)."""


def abort_in_engine(background: BackgroundTasks, engine: Engine, active: ActiveRequest) -> asyncio.Task[None]:
    """The driver's abort of ``active``, started once however many paths ask for it."""
    if active.engine_abort is None:
        active.engine_abort = background.spawn(_abort(engine, active.request_id), f"abort {active.request_id}")
    return active.engine_abort


def abort_then_release(
    background: BackgroundTasks, registry: RequestRegistry, engine: Engine, active: ActiveRequest
) -> None:
    """Abort ``active`` in its driver (if not already under way), then free its id as finished."""
    pending = abort_in_engine(background, engine, active)
    background.spawn(_release_when_done(registry, active, pending), f"release {active.request_id}")


async def _abort(engine: Engine, request_id: str) -> None:
    try:
        async with asyncio.timeout(ENGINE_ABORT_TIMEOUT_S):
            await engine.backend.abort(request_id)
    except TimeoutError:
        log.warning(
            "engine %r did not confirm the abort of %r within %gs; its id is free again",
            engine.served_name,
            request_id,
            ENGINE_ABORT_TIMEOUT_S,
        )


async def _release_when_done(registry: RequestRegistry, active: ActiveRequest, pending: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait({pending})  # its failure is logged where it was spawned
    finally:
        registry.release(active)


__all__ = ["ENGINE_ABORT_TIMEOUT_S", "abort_in_engine", "abort_then_release"]
