"""The fake TensorRT-LLM installed under its module names, and a gateway serving the driver on it.

Nothing here imports TensorRT-LLM: the ``fake`` fixture makes ``import tensorrt_llm`` find
``fake_api``/``fake_llm`` for one test, so the driver's real import lines and calls run.
"""

from __future__ import annotations

from typing import Any

import pytest
from openengine_backends.trtllm import TrtllmBackend, TrtllmSettings, engine
from openengine_gateway import pb

from ..fake_serving import MODEL, generate_request
from .fake_api import Installed, install


@pytest.fixture(autouse=True)
def _quick_queue_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake answers at once: shorter statistics reads keep each engine start short."""
    monkeypatch.setattr(engine, "STATS_TIMEOUT_S", 0.05)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Installed:
    """TensorRT-LLM 1.2's API, faked (``generate_async`` without a priority)."""
    return install(monkeypatch)


def trtllm(model: str = "/models/fake-llama", **options: Any) -> TrtllmBackend:
    """A driver for the fake model (``model`` is where its generation config is read); ``options`` are ``LLM``
    arguments or driver options."""
    return TrtllmBackend(TrtllmSettings(model=model, **options))


def request(prompt: str | list[int] = "The fox", model: str = MODEL, **fields: Any) -> pb.GenerateRequest:
    """A Generate request from text or token ids, with this fake model's default prompt.

    Greedy unless ``sampling`` is given (``sampling=None`` leaves every knob unset).
    """
    fields.setdefault("sampling", pb.SamplingParams(temperature=0.0))
    return generate_request(prompt, model, **fields)


def token_ids(responses: list[pb.GenerateResponse], index: int = 0) -> list[int]:
    """Output ``index``'s token ids."""
    return [
        t.token_id for r in responses if r.HasField("token") and r.token.output_index == index for t in r.token.tokens
    ]
