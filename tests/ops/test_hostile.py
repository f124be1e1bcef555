"""A hostile client against a shared endpoint: what it sends must not leak, crash or starve.

Each test is a client doing what a buggy or malicious one would, over real gRPC (or raw
HTTP/2 where grpc's own client refuses to send it): malformed metadata, oversized fields,
another token's requests, a client that reads slowly or never. The gateway must answer each
with a clear status, keep every secret out of its log, and keep serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from openengine_gateway import pb
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth

from tests.ops.raw_h2 import raw_call
from tests.ops.support import gateway
from tests.process import gateway_process

TOKEN = "hostile-5ecret-d1stinct-41c9"
"""A token no log line could contain by accident."""
_PATH = f"/{pb.SERVICE_NAME}/GetLoad"


def _bad_bearer(token: str) -> list[tuple[bytes, bytes]]:
    """An ``authorization`` header with the token and one byte that is not UTF-8."""
    return [(b"authorization", b"Bearer " + token.encode() + b"\xff")]


async def test_a_metadata_value_that_is_not_utf8_never_logs_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for client_side in ("hpack", "h2"):  # the raw client's own DEBUG lines quote what it sent
        caplog.set_level(logging.INFO, logger=client_side)
    async with gateway(server=ServerOptions(auth=TokenAuth([TOKEN]))) as running:
        port = running.server.port
        answer = await asyncio.to_thread(raw_call, port, _PATH, _bad_bearer(TOKEN))
        other = await asyncio.to_thread(raw_call, port, _PATH, [(b"x-trace", TOKEN.encode() + b"\xfe")])
    assert answer[b"grpc-status"] == b"16" and other[b"grpc-status"] == b"16"  # UNAUTHENTICATED
    assert "d1stinct" not in caplog.text
    assert "not UTF-8" in caplog.text  # the event itself is kept, at WARNING, without its value
    assert all(record.levelno < logging.ERROR for record in caplog.records)


async def test_the_command_logs_no_token_from_undecodable_metadata(tmp_path: Path) -> None:
    """The real command's stderr, with its own log setup, at DEBUG and with grpc's tracing on."""
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    args = ("--backend", "mock", "--log-level", "DEBUG", "--auth-token-file", str(token_file))
    async with gateway_process(*args, cwd=tmp_path) as process:
        port = int(process.address.rsplit(":", 1)[1])
        answer = await asyncio.to_thread(raw_call, port, _PATH, _bad_bearer(TOKEN))
        assert await process.stop() == 0
    assert answer[b"grpc-status"] == b"16"
    text = process.log.read_text()
    assert "not UTF-8" in text
    assert "d1stinct" not in text
