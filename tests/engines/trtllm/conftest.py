"""One real TensorRT-LLM engine per test session, serving the tiny Llama behind an in-process gateway.

Nothing here imports TensorRT-LLM, torch or transformers at collection: every test module starts
with ``pytest.importorskip("tensorrt_llm")``, so the suite skips cleanly where it is not installed
(every CPU machine). ``scripts/gpu_check_trtllm.sh`` runs it on a GPU.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL

TOKENS_PER_BLOCK = 32


def llm_options(**overrides: Any) -> dict[str, Any]:
    """``LLM`` arguments for the tiny model: small limits, KV events and a grammar backend on."""
    options: dict[str, Any] = {
        "dtype": "bfloat16",
        "max_seq_len": 512,
        "max_batch_size": 8,
        "max_num_tokens": 256,  # under max_seq_len: the prompt bound without chunked prefill (test_limits)
        "guided_decoding_backend": "xgrammar",
        "kv_cache_config": {
            "tokens_per_block": TOKENS_PER_BLOCK,
            "event_buffer_max_size": 1024,
            "enable_block_reuse": True,
            "free_gpu_memory_fraction": 0.1,
        },
    }
    options.update(overrides)
    return options


def option_flags(options: dict[str, Any]) -> list[str]:
    """``LLM`` arguments as the command line's ``--name value`` driver options."""
    return [part for name, value in options.items() for part in (f"--{name.replace('_', '-')}", _flag_value(value))]


def _flag_value(value: Any) -> str:
    """A nested config as JSON text, a bool as ``true``/``false``, anything else as itself."""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama the vLLM tests use, built offline (random weights, a locally trained tokenizer)."""
    from openengine_backends.vllm.tiny_model import build

    return build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
async def gateway(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    """The gateway serving the session's one TensorRT-LLM engine as ``tiny``."""
    from openengine_backends.trtllm import TrtllmBackend, TrtllmSettings

    backend = TrtllmBackend(TrtllmSettings(model=str(tiny_model), **llm_options()))
    async with serve_backends([(MODEL, backend)]) as running:
        yield running


@pytest.fixture
def stub(gateway: RunningGateway) -> pb.OpenEngineStub:
    """A client of the session's gateway."""
    return gateway.stub


@pytest.fixture
def llm(gateway: RunningGateway) -> Any:
    """The engine's own ``LLM``, to compare the gateway's stream with TensorRT-LLM's own results."""
    return gateway.gateway.engines.engine(MODEL).backend._llm  # type: ignore[attr-defined]
