"""What every real-engine test module needs: the served name, a free port, requests for the model."""

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


def generate_request(request_id: str, *, prompt: str | list[int], **fields: Any) -> pb.GenerateRequest:
    """A Generate request for the tiny model from a text or token-id prompt."""
    request = pb.GenerateRequest(request_id=request_id, model=MODEL, **fields)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.token_ids.ids.extend(prompt)
    return request
