"""One real vLLM engine per test session, serving the tiny Llama behind an in-process gateway.

Nothing here imports vLLM, torch or transformers at collection: every test module starts with
``pytest.importorskip("vllm")``, so the suite skips cleanly where vLLM is not installed.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

if TYPE_CHECKING:
    from .reference import Reference

MODEL = "tiny"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def engine_options(**overrides: Any) -> dict[str, Any]:
    """vLLM engine arguments for the tiny model: fp32, eager, small KV cache, every feature on."""
    options: dict[str, Any] = {
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 512,
        "max_logprobs": -1,
        "block_size": 32,
        "kv_cache_memory_bytes": 256 << 20,
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 2,
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


async def collect(stub: pb.OpenEngineStub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    """Every response of one Generate stream."""
    return [response async for response in stub.Generate(request)]


def generate_request(request_id: str, *, prompt: str | list[int], **fields: Any) -> pb.GenerateRequest:
    """A Generate request for the tiny model from a text or token-id prompt."""
    request = pb.GenerateRequest(request_id=request_id, model=MODEL, **fields)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.token_ids.ids.extend(prompt)
    return request


def tokens(responses: list[pb.GenerateResponse], index: int = 0) -> list[pb.TokenInfo]:
    """The token records of output ``index``, in order."""
    return [t for r in responses if r.HasField("token") and r.token.output_index == index for t in r.token.tokens]


def text(responses: list[pb.GenerateResponse], index: int = 0) -> str:
    """The text of output ``index``."""
    return "".join(r.token.text for r in responses if r.HasField("token") and r.token.output_index == index)


def finished(responses: list[pb.GenerateResponse]) -> dict[int, pb.GenerationFinished]:
    """Each output's ``GenerationFinished``."""
    return {r.finished.output_index: r.finished for r in responses if r.HasField("finished")}
