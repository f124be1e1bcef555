"""Starting vLLM's ``AsyncLLM`` the gateway's way: its stats kept for ``load``, its socket files in a
directory of the engine's own, a KV cache sized for a CPU, its tokenizer's identity read once.
vLLM is imported when an engine starts."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import zmq
from openengine_gateway.spi import vocabulary_digest

from .cpu_memory import CPU_KV_CACHE_ENV, cpu_kv_cache_default
from .engine_args import engine_kwargs
from .settings import VllmSettings

log = logging.getLogger(__name__)


def stats_logger(sink: dict[int, Any]) -> Any:
    """A vLLM stat logger class that keeps each engine's latest ``SchedulerStats`` in ``sink``."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    class LatestSchedulerStats(AggregateStatLoggerBase):  # type: ignore[misc]  # vLLM is Any to mypy (pyproject.toml)
        def __init__(self, vllm_config: Any, engine_indexes: list[int]) -> None:
            del vllm_config, engine_indexes

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                sink[engine_idx] = scheduler_stats

        def log_engine_initialized(self) -> None:
            return None

    return LatestSchedulerStats


def keep_only_stat_logger(engine: Any, kept: type) -> None:
    """Drop the stat loggers vLLM adds beside ``kept``: its Prometheus logger and its periodic log.

    Nothing reads them here: the gateway serves its own metrics registry, not vLLM's, and never
    calls ``do_log_stats``, which is what prints vLLM's stats log. The Prometheus logger alone cost
    about 4 us of frontend CPU per output token (measured side by side on the tiny Llama).
    """
    manager = getattr(engine, "logger_manager", None)  # None when stats are disabled
    if manager is not None:
        manager.stat_loggers[:] = [logger for logger in manager.stat_loggers if isinstance(logger, kept)]


def environment_cached(cached: bool) -> None:
    """Turn vLLM's cache of its environment variables on (an engine has started) or off (one starts).

    ``vllm.envs`` reads the process environment on every access, and vLLM's output path reads it
    for every output token (``IterationStats.update_from_output``): about 2.5 us of frontend CPU per
    token on the tiny Llama, a tenth of the frontend's own work (measured in process, side by side).
    vLLM's engine core and workers cache it once started (``enable_envs_cache``); the frontend
    does the same, and clears the cache while another engine starts in this process, so that
    start reads the environment as it is then (its own ``VLLM_RPC_BASE_PATH``, ``rpc_base_path``).
    """
    import vllm.envs

    if cached:
        vllm.envs.enable_envs_cache()
    else:
        vllm.envs.disable_envs_cache()


_SOCKET_NAME_CHARS = 37
"""``/<uuid4>``: what vLLM appends to its RPC base path for each socket."""


def socket_directory() -> tempfile.TemporaryDirectory[str] | None:
    """A directory of this engine's own for vLLM's socket files, under vLLM's base path; None
    where its longer paths would pass ZeroMQ's limit on IPC paths (vLLM then uses the base)."""
    base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
    if len(os.path.join(base, "oe-vllm-12345678")) + _SOCKET_NAME_CHARS > zmq.IPC_PATH_MAX_LEN:
        log.info("vLLM's socket files stay in %s: a directory of their own there would make their paths too long", base)
        return None
    return tempfile.TemporaryDirectory(prefix="oe-vllm-", dir=base)


@contextlib.contextmanager
def rpc_base_path(path: str) -> Iterator[None]:
    """Point vLLM's IPC socket files at ``path`` while an engine starts (its processes inherit it).

    vLLM names its ZeroMQ sockets ``$VLLM_RPC_BASE_PATH/<uuid>`` (the temporary directory by
    default) and leaves the files behind when it shuts down: seven a start, in /tmp. Each engine
    here gets a directory of its own, removed when the engine stops.
    """
    previous = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    try:
        yield
    finally:
        if previous is None:
            del os.environ["VLLM_RPC_BASE_PATH"]
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = previous


def sized_for_cpu(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with a KV cache size on a CPU where the caller gave none (``cpu_memory``):
    vLLM's own default there is 92 % of the machine's RAM."""
    from vllm.platforms import current_platform

    size = cpu_kv_cache_default(options, os.environ) if current_platform.is_cpu() else None
    if size is None:
        return options
    log.info(
        "vLLM on a CPU: KV cache of %d MiB (kv_cache_memory_bytes); set %s (GiB) or kv_cache_memory_bytes to change it",
        size >> 20,
        CPU_KV_CACHE_ENV,
    )
    return {**options, "kv_cache_memory_bytes": size}


def engine_args(settings: VllmSettings) -> Any:
    """vLLM's ``AsyncEngineArgs`` for the driver's settings, the KV cache sized for a CPU (``sized_for_cpu``)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(model=settings.model, **engine_kwargs(sized_for_cpu(settings.engine_options)))


def tokenizer_id(tokenizer: Any) -> str | None:
    """``EngineFacts.tokenizer_id`` of the engine's tokenizer (vLLM's ``TokenizerLike``: its
    vocabulary and special ids); None for an engine started without one (``skip_tokenizer_init``)."""
    if tokenizer is None:
        return None
    return vocabulary_digest(tokenizer.get_vocab(), tokenizer.all_special_ids)


__all__ = [
    "engine_args",
    "environment_cached",
    "keep_only_stat_logger",
    "rpc_base_path",
    "sized_for_cpu",
    "socket_directory",
    "stats_logger",
    "tokenizer_id",
]
