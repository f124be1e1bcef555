"""How much memory a vLLM engine on a CPU may take for its KV cache, when the caller did not say.

vLLM 0.32's CPU worker (``vllm/v1/worker/cpu_worker.py``) sizes the KV cache from
``gpu_memory_utilization`` (default 0.92) of the node's *total* RAM, less what the worker already
holds, unless ``kv_cache_memory_bytes`` is set (``VLLM_CPU_KVCACHE_SPACE``, in GiB, sets it in
``CpuPlatform.check_and_update_config``). Left alone it reserves 92 % of the machine, and where
that much is not free (another server up) the worker dies at startup with a memory error that
hides the cause. The driver gives a CPU engine a small explicit size instead. Pure: no vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's own setting: the KV cache size of a CPU engine in GiB (a non-empty value wins over everything)."""

CPU_KV_CACHE_DEFAULT_BYTES = 1 << 30
"""1 GiB: the driver's KV cache size on a CPU when neither ``VLLM_CPU_KVCACHE_SPACE`` nor an engine
argument sizes it (tens of thousands of tokens for a small model; ``make serve`` uses the same)."""

SIZING_ARGUMENTS = ("kv_cache_memory_bytes", "gpu_memory_utilization")
"""Engine arguments that size a CPU engine's KV cache (the second as a fraction of total RAM)."""


def cpu_kv_cache_default(options: Mapping[str, Any], environ: Mapping[str, str]) -> int | None:
    """The ``kv_cache_memory_bytes`` to give a CPU engine; None where the caller already sized it.

    ``options`` are the engine arguments as given; ``environ`` is the process environment.
    """
    if environ.get(CPU_KV_CACHE_ENV, "") != "":
        return None
    if any(options.get(name) is not None for name in SIZING_ARGUMENTS):
        return None
    return CPU_KV_CACHE_DEFAULT_BYTES


__all__ = ["CPU_KV_CACHE_DEFAULT_BYTES", "CPU_KV_CACHE_ENV", "SIZING_ARGUMENTS", "cpu_kv_cache_default"]
