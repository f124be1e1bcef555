"""The fake SGLang installed under its module names, and a gateway serving the driver on it.

Nothing here imports SGLang: the ``fake`` fixture makes ``import sglang`` find ``fake_api`` and
``fake_engine`` for one test, so the driver's real import lines and calls run.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

from .fake_api import install

MODEL = "fake"
GREEDY = pb.SamplingParams(temperature=0.0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """SGLang 0.5.23's API, faked, for one test."""
    return install(monkeypatch)


def sglang(model: str = "/models/fake-llm", **options: Any) -> SglangBackend:
    """A driver for a fake model; ``options`` are SGLang server arguments."""
    return SglangBackend(SglangSettings(model=model, **options))


@contextlib.asynccontextmanager
async def serving(*backends: SglangBackend) -> AsyncIterator[RunningGateway]:
    """The gateway serving each backend (as ``fake``, ``fake1``...)."""
    names = [MODEL if position == 0 else f"{MODEL}{position}" for position in range(len(backends))]
    async with serve_backends(list(zip(names, backends, strict=True))) as running:
        yield running


def request(prompt: str | list[int] = "say", model: str = MODEL, **fields: Any) -> pb.GenerateRequest:
    """A Generate request from text or token ids."""
    message = pb.GenerateRequest(model=model, **fields)
    if isinstance(prompt, str):
        message.prompt = prompt
    else:
        message.token_ids.ids.extend(prompt)
    return message
