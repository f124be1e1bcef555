"""What every real-engine test module needs: the served name, requests, and reading a stream back."""

from __future__ import annotations

import socket
from typing import Any

from openengine_gateway import pb

MODEL = "tiny"
"""The name each engine suite serves its tiny model under."""


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


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
