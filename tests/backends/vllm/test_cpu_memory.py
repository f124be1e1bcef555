"""A vLLM engine on a CPU gets a small KV cache unless the caller sized it (``cpu_memory``)."""

from __future__ import annotations

import pytest
from openengine_backends.vllm.cpu_memory import CPU_KV_CACHE_DEFAULT_BYTES, cpu_kv_cache_default


def test_an_unsized_engine_gets_one_gib_not_92_percent_of_ram() -> None:
    assert cpu_kv_cache_default({"dtype": "float32"}, {}) == CPU_KV_CACHE_DEFAULT_BYTES == 1 << 30


@pytest.mark.parametrize(
    ("options", "environ"),
    [
        ({}, {"VLLM_CPU_KVCACHE_SPACE": "4"}),
        ({"kv_cache_memory_bytes": 256 << 20}, {}),
        ({"kv_cache_memory_bytes": "268435456"}, {}),
        ({"gpu_memory_utilization": 0.5}, {}),
    ],
)
def test_the_callers_size_wins(options: dict[str, object], environ: dict[str, str]) -> None:
    assert cpu_kv_cache_default(options, environ) is None


def test_an_empty_variable_is_unset_as_vllm_reads_it() -> None:
    """``CpuPlatform.check_and_update_config`` ignores an empty ``VLLM_CPU_KVCACHE_SPACE``."""
    assert cpu_kv_cache_default({}, {"VLLM_CPU_KVCACHE_SPACE": ""}) == CPU_KV_CACHE_DEFAULT_BYTES
    assert cpu_kv_cache_default({"kv_cache_memory_bytes": None}, {}) == CPU_KV_CACHE_DEFAULT_BYTES
