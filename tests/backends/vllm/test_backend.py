"""``VllmBackend``'s answers from its own state, with the started engine replaced by its shape."""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from openengine_backends.vllm import VllmBackend, VllmSettings
from openengine_gateway import pb

from .shapes import SchedulerStats, VllmConfig
from .test_capabilities import FEATURES


@dataclass
class EngineCore:
    """``AsyncLLM.engine_core``: the one rank of a single engine."""

    engine_ranks_managed: list[int] = field(default_factory=lambda: [0])


@dataclass
class AsyncLLM:
    """The parts of ``vllm.v1.engine.async_llm.AsyncLLM`` that ``load`` reads."""

    errored: bool = False
    vllm_config: VllmConfig = field(default_factory=VllmConfig)
    engine_core: EngineCore = field(default_factory=EngineCore)
    output_handler: None = None
    shut_down: bool = False

    def shutdown(self) -> None:
        self.shut_down = True


def started(engine: AsyncLLM) -> VllmBackend:
    """A backend as ``start`` leaves it, with its stat logger having seen one running request."""
    backend = VllmBackend(VllmSettings(model="/m"))
    backend._engine, backend._features, backend._stats_enabled = engine, FEATURES, True
    backend._stats[0] = SchedulerStats(num_running_reqs=1, kv_cache_usage=0.01)
    return backend


async def test_load_comes_from_the_latest_scheduler_stats() -> None:
    load = await started(AsyncLLM()).load()
    assert load.running_requests == 1 and load.used_kv_blocks == 10 and load.total_kv_blocks == 1000


async def test_a_dead_engine_core_reports_no_load() -> None:
    """Its last stats describe requests that no longer run: every field is absent (unavailable)."""
    assert await started(AsyncLLM(errored=True)).load() == pb.LoadInfo()


async def test_stop_shuts_the_engine_down_and_removes_its_socket_files(tmp_path: Path) -> None:
    """vLLM leaves its IPC socket files behind; the directory ``start`` gave them goes with the engine."""
    engine = AsyncLLM()
    backend = started(engine)
    backend._sockets = tempfile.TemporaryDirectory(dir=tmp_path)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(Path(backend._sockets.name) / "ipc"))
    await backend.stop()
    await backend.stop()  # a second stop is harmless
    assert engine.shut_down and os.listdir(tmp_path) == []
