"""``sharing``: a frontend's stats stamped with when the shared engine core made them (no vLLM needed)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from openengine_backends.vllm.sharing import stamp_stats, unix_nanos

from .shapes import SchedulerStats
from .test_backend import AsyncLLM, started


@dataclass
class Outputs:
    """``EngineCoreOutputs``: the fields the stamp reads."""

    timestamp: float
    scheduler_stats: Any = None
    engine_index: int = 0


@dataclass
class Core:
    """``AsyncMPClient``: what AsyncLLM's output loop pulls, in order."""

    batches: list[Outputs] = field(default_factory=list)

    async def get_output_async(self) -> Outputs:
        return self.batches.pop(0)


async def test_the_stamp_is_the_core_time_of_the_last_stats() -> None:
    engine = AsyncLLM()
    engine.engine_core = Core([Outputs(5.0, SchedulerStats()), Outputs(6.0)])  # type: ignore[assignment]
    stamps: dict[int, float] = {}
    stamp_stats(engine, stamps)
    assert (await engine.engine_core.get_output_async()).timestamp == 5.0
    await engine.engine_core.get_output_async()  # no stats: the stamp stays
    assert stamps == {0: 5.0}


async def test_an_attached_frontends_load_says_when_the_engine_measured_it() -> None:
    backend = started(AsyncLLM())
    now = time.monotonic()
    backend._stamps[0] = now - 1.0
    load = await backend.load()
    assert load.timestamp_unix_nanos is not None
    assert abs(load.timestamp_unix_nanos - (time.time_ns() - 1_000_000_000)) < 100_000_000
    backend._stamps.clear()
    assert (await backend.load()).timestamp_unix_nanos is None  # one frontend: the gateway stamps it


def test_unix_nanos_keeps_the_order_of_monotonic_readings() -> None:
    early, late = time.monotonic() - 2, time.monotonic() - 1
    assert unix_nanos(early) < unix_nanos(late) <= time.time_ns()
