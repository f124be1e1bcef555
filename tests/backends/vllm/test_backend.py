"""``VllmBackend``'s answers from its own state, with the started engine replaced by its shape."""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openengine_backends.vllm import VllmBackend, VllmSettings
from openengine_gateway.spi import Load

from .shapes import SchedulerStats, VllmConfig
from .test_capabilities import FEATURES


@dataclass
class BackgroundResources:
    """``AsyncMPClient.resources`` (vllm/v1/engine/core_client.py): no engine-core process here."""

    engine_manager: None = None


@dataclass
class EngineCore:
    """``AsyncLLM.engine_core``: the one rank of a single engine."""

    engine_ranks_managed: list[int] = field(default_factory=lambda: [0])
    resources: BackgroundResources = field(default_factory=BackgroundResources)


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
    assert await started(AsyncLLM(errored=True)).load() == Load()


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


def test_socket_files_get_a_directory_of_their_own_only_where_their_paths_stay_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZeroMQ refuses IPC paths over 107 characters; vLLM appends /<uuid4> to the base path."""
    from openengine_backends.vllm.startup import socket_directory

    with tempfile.TemporaryDirectory(prefix="b") as base:
        monkeypatch.setenv("VLLM_RPC_BASE_PATH", base)
        directory = socket_directory()
        assert directory is not None and os.path.dirname(directory.name) == base
        assert len(os.path.join(directory.name, "0" * 36)) <= 107
        directory.cleanup()
    deep = Path("/nonexistent") / ("d" * (107 - len("/nonexistent") - 40))
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(deep))
    assert len(os.path.join(deep, "0" * 36)) <= 107 < len(os.path.join(deep, "oe-vllm-12345678", "0" * 36))
    assert socket_directory() is None, "vLLM's own base path still fits: use it"


def test_vllm_reads_its_environment_once_an_engine_has_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached after a start (vLLM's output path reads it per token), fresh while the next engine starts."""
    import vllm.envs
    from openengine_backends.vllm.startup import environment_cached

    was_cached = vllm.envs._is_envs_cache_enabled()
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/before")
    try:
        environment_cached(False)
        assert vllm.envs.VLLM_RPC_BASE_PATH == "/before"
        environment_cached(True)
        monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/after")
        assert vllm.envs.VLLM_RPC_BASE_PATH == "/before", "read once, as vLLM's engine core does"
        environment_cached(False)
        assert vllm.envs.VLLM_RPC_BASE_PATH == "/after", "the next start sees the environment as it is"
    finally:
        environment_cached(False)
        monkeypatch.undo()  # before caching again: the cache keeps what the environment holds then
        environment_cached(was_cached)
