"""One real vLLM engine per test session, serving the tiny Llama behind an in-process gateway.

Nothing here imports vLLM, torch or transformers at collection: every test module starts with
``pytest.importorskip("vllm")``, so the suite skips cleanly where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL, free_port

if TYPE_CHECKING:
    from .reference import Reference

CONTEXT = 8192
"""The engines' context (the tiny model's rotary positions stretch to any length)."""
LONG = pb.StoppingOptions(max_tokens=CONTEXT - 256, ignore_eos=True)
"""Tens of seconds of work for the tiny model on a CPU: still running when a test acts on it, even after vLLM's
CPU engine has kept the test process off the CPUs for seconds (docs/performance.md, "Streams that arrive at
once"), which a request of a few hundred tokens did not survive."""


def engine_options(**overrides: Any) -> dict[str, Any]:
    """vLLM engine arguments for the tiny model: fp32, eager, small KV cache, every feature on but LoRA
    (``test_lora`` starts its own engine: a LoRA-enabled CPU engine has no prompt logprobs)."""
    options: dict[str, Any] = {
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": CONTEXT,
        "hf_overrides": {"max_position_embeddings": CONTEXT},
        "max_logprobs": -1,
        "block_size": 32,
        "kv_cache_memory_bytes": 256 << 20,
        "scheduling_policy": "priority",
        "kv_events_config": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{free_port()}",
            "topic": "kv",
        },
    }
    options.update(overrides)
    return options


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, built offline (random weights from a fixed seed, a locally trained tokenizer)."""
    from openengine_backends.vllm.tiny_model import build

    return build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def reference(tiny_model: Path) -> Reference:
    """The same model in ``transformers``."""
    from .reference import Reference

    return Reference(tiny_model)


@pytest.fixture(scope="session")
async def gateway(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    """The gateway serving the session's one vLLM engine as ``tiny``."""
    from openengine_backends.vllm import VllmBackend, VllmSettings

    backend = VllmBackend(VllmSettings(model=str(tiny_model), **engine_options()))
    async with serve_backends([(MODEL, backend)]) as running:
        yield running


@pytest.fixture
def stub(gateway: RunningGateway) -> pb.OpenEngineStub:
    """A client of the session's gateway."""
    return gateway.stub
