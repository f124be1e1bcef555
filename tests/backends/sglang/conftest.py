"""The fake SGLang installed under its module names, and a gateway serving the driver on it.

Nothing here imports SGLang: the ``fake`` fixture makes ``import sglang`` find ``fake_api`` and
``fake_engine`` for one test, so the driver's real import lines and calls run.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_gateway import pb

from ..fake_serving import MODEL, generate_request
from .fake_api import install

GREEDY = pb.SamplingParams(temperature=0.0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """SGLang 0.5.23's API, faked, for one test."""
    return install(monkeypatch)


def sglang(model: str = "/models/fake-llm", **options: Any) -> SglangBackend:
    """A driver for a fake model; ``options`` are SGLang server arguments."""
    return SglangBackend(SglangSettings(model=model, **options))


def request(prompt: str | list[int] = "say", model: str = MODEL, **fields: Any) -> pb.GenerateRequest:
    """A Generate request from text or token ids, with this fake model's default prompt."""
    return generate_request(prompt, model, **fields)
