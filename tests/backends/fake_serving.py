"""Serving drivers whose engines are test fakes (SGLang, TensorRT-LLM): the gateway and its requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openengine_gateway import pb
from openengine_gateway.spi import Backend
from openengine_gateway.testing import RunningGateway, serve_backends

MODEL = "fake"


@contextlib.asynccontextmanager
async def serving(*backends: Backend) -> AsyncIterator[RunningGateway]:
    """The gateway serving each backend (as ``fake``, ``fake1``...)."""
    names = [MODEL if position == 0 else f"{MODEL}{position}" for position in range(len(backends))]
    async with serve_backends(list(zip(names, backends, strict=True))) as running:
        yield running


def generate_request(prompt: str | list[int], model: str = MODEL, **fields: Any) -> pb.GenerateRequest:
    """A Generate request from text or token ids."""
    message = pb.GenerateRequest(model=model, **fields)
    if isinstance(prompt, str):
        message.prompt = prompt
    else:
        message.token_ids.ids.extend(prompt)
    return message
