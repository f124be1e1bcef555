"""Log lines as an operator reads them: JSON or text, tagged with the request they serve, never a token.

The gateway's own ``logs.configure`` is pointed at a buffer (it writes to ``sys.stderr``), a
gateway serves requests whose handling logs (a finished stream at DEBUG, a driver failure
with its traceback, a failed task), and every captured line is checked. The last test runs
the real command with ``--log-format json`` and reads its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
from openengine_gateway import logs, pb
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth
from openengine_gateway.spi import EmbedCall, GenerationRequest, OutputFinished, TokenDelta, TokenRecord, UsageReport
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.fakes import FakeBackend, scripted
from tests.ops.support import free_port
from tests.process import gateway_process

TOKEN = "tok-d1stinct1ve-5ecret-7f3a9c"
"""A token no log line could contain by accident."""


@contextlib.contextmanager
def configured(log_format: logs.LogFormat) -> Iterator[io.StringIO]:
    """``logs.configure`` at DEBUG writing to a buffer; the root logger is restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    with mock.patch.object(sys, "stderr", buffer):
        logs.configure("DEBUG", log_format)
    try:
        yield buffer
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def failing_backend() -> FakeBackend:
    """Request ``ok`` streams one token; ``boom`` and every Embed fail inside the driver."""
    embedding = pb.EmbedCapabilities(supported=True, input_types=[pb.TASK_INPUT_TYPE_TEXT])
    backend = FakeBackend(model=pb.ModelInfo(supports_text_input=True, tasks=pb.TaskCapabilities(embed=embedding)))
    succeed = scripted(
        TokenDelta(0, [TokenRecord(7, "hi")], "hi"), UsageReport(1, 1), OutputFinished(0, pb.FINISH_REASON_LENGTH)
    )
    fail = scripted(error=RuntimeError("boom in the driver"))

    def generate(request: GenerationRequest) -> Any:
        return (succeed if request.request_id.rpartition("/")[2] == "ok" else fail)(request)  # a token's: NAME/ID

    async def embed(_call: EmbedCall) -> Any:
        raise RuntimeError("embed broke in the driver")

    backend.on_generate = generate
    backend.on_embed = embed
    return backend


async def serve_requests(running: RunningGateway) -> None:
    """One finished stream, one whose driver raises, one failing Embed, then a line outside any request."""
    for request_id in ("ok", "boom"):
        responses = [r async for r in running.stub.Generate(pb.GenerateRequest(request_id=request_id, prompt="x"))]
        assert responses[-1].HasField("finished" if request_id == "ok" else "error")
    embed = pb.EmbedRequest(
        context=pb.TaskRequestContext(request_id="embed-1", model="m"), inputs=[pb.TaskInput(item_id="a", text="x")]
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await running.stub.Embed(embed)
    logging.getLogger("tests.ops.outside").info("outside any request")


def entries(buffer: io.StringIO) -> list[dict[str, object]]:
    """Every line as a JSON object; a line that is not one fails."""
    lines = [line for line in buffer.getvalue().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        entry = json.loads(line)
        assert isinstance(entry, dict) and {"time", "level", "logger", "message"} <= entry.keys(), line
        parsed.append(entry)
    return parsed


async def test_json_logs_one_object_per_line_with_the_request_id() -> None:
    with configured("json") as buffer:
        async with serve_backends([("m", failing_backend())]) as running:
            await serve_requests(running)
    lines = entries(buffer)
    by_message = {str(e["message"]): e for e in lines}
    assert by_message["generate ended: finished"]["request_id"] == "ok"
    fault = "backend 'fake' broke the backend SPI: "
    failed = by_message[fault + "its event stream raised RuntimeError: boom in the driver"]
    assert failed["request_id"] == "boom" and failed["level"] == "ERROR"
    assert "RuntimeError: boom in the driver" in str(failed["exception"])  # the traceback inside one line
    embed = by_message[fault + "embed raised RuntimeError: embed broke in the driver"]
    assert embed["request_id"] == "embed-1" and "Traceback" in str(embed["exception"])
    assert "request_id" not in by_message["outside any request"]
    for entry in lines:  # no line is tagged with a request it was not logged for
        if "request_id" in entry:
            assert str(entry["request_id"]) in ("ok", "boom", "embed-1"), entry
            if "boom" in str(entry["message"]):
                assert entry["request_id"] == "boom", entry


async def test_text_logs_prefix_the_request_id() -> None:
    with configured("text") as buffer:
        async with serve_backends([("m", failing_backend())]) as running:
            await serve_requests(running)
    text = buffer.getvalue()
    assert re.search(r" DEBUG openengine_gateway\.core\.generation: \[ok\] generate ended: finished$", text, re.M)
    faults = r" ERROR openengine_gateway\.core\.driver_faults: \[{}\] backend 'fake' broke the backend SPI: {}$"
    assert re.search(faults.format("boom", "its event stream raised RuntimeError: boom in the driver"), text, re.M)
    assert re.search(faults.format("embed-1", "embed raised RuntimeError: embed broke in the driver"), text, re.M)
    assert re.search(r" INFO tests\.ops\.outside: outside any request$", text, re.M)
    assert "RuntimeError: boom in the driver" in text


async def test_no_token_reaches_a_log_line_or_a_status(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    presented = [f"Bearer {TOKEN}", f"Bearer {TOKEN}-wrong", f"Basic {TOKEN}", f"bearer  {TOKEN} "]
    details = []
    with configured("json") as buffer:
        server = ServerOptions(auth=TokenAuth([TOKEN]))
        async with serve_backends([("m", failing_backend())], server_options=server) as running:
            for value in presented:
                metadata = (("authorization", value),)
                request = pb.GenerateRequest(request_id="ok", prompt="x")
                try:
                    [r async for r in running.stub.Generate(request, metadata=metadata)]
                except grpc.aio.AioRpcError as error:
                    details.append(error.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    embed = pb.EmbedRequest(
                        context=pb.TaskRequestContext(request_id="e", model="m"),
                        inputs=[pb.TaskInput(item_id="a", text="x")],
                    )
                    await running.stub.Embed(embed, metadata=metadata)
                details.append(failed.value.details() or "")
    assert len(details) == 6  # two valid presentations reached Generate; every other call was refused
    captured = buffer.getvalue()
    assert "generate ended: finished" in captured and "embed raised RuntimeError" in captured  # it saw the calls
    for where in (captured, caplog.text, *details):
        assert "d1stinct1ve" not in where


def test_any_line_with_a_bearer_credential_is_blanked_whoever_logs_it() -> None:
    """Code the gateway does not own may log what it was sent; the handler blanks the credential."""
    with configured("text") as buffer:
        logging.getLogger("some.library").warning("sent headers %s", {"authorization": f"Bearer {TOKEN}"})
        logging.getLogger("some.library").info("retrying with bearer %s", TOKEN)
    text = buffer.getvalue()
    assert "d1stinct1ve" not in text and text.count("Bearer <redacted>") + text.count("bearer <redacted>") == 2


async def test_the_command_logs_json_lines_and_serves_metrics(tmp_path: Path) -> None:
    """``--log-format json --metrics-port`` end to end: stderr is JSON lines, the port answers, no token."""
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    args = ("--backend", "mock", "--served-model-name", "m", "--log-format", "json", "--log-level", "DEBUG")
    async with gateway_process(
        *args, "--metrics-port", str(port), "--auth-token-file", str(token_file), cwd=tmp_path
    ) as process:
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = pb.OpenEngineStub(channel)
            request = pb.GenerateRequest(request_id="proc-1", model="m", prompt="Hello")
            request.stopping.max_tokens = 3
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            assert [r async for r in stub.Generate(request, metadata=metadata)][-1].HasField("finished")
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetLoad(pb.GetLoadRequest())

        def get() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())

        page = await asyncio.to_thread(get)
        assert await process.stop() == 0
    assert 'openengine_gateway_requests_total{code="OK",rpc="Generate"} 1.0' in page
    assert 'openengine_gateway_requests_total{code="UNAUTHENTICATED",rpc="GetLoad"} 1.0' in page
    text = process.log.read_text()
    lines = entries(io.StringIO(text))
    ended = [e for e in lines if e["message"] == "generate ended: finished"]
    assert any(e.get("request_id") == "inference-1/proc-1" for e in ended), text  # namespaced by its token
    assert any(e["message"] == "stopped" for e in lines)
    assert "d1stinct1ve" not in text


def test_a_client_value_cannot_forge_a_text_line_or_send_escapes() -> None:
    """A request id with a newline, a forged audit line and ANSI escapes stays on its one line, escaped."""
    audit = "2026-01-01 00:00:00,000 INFO openengine_gateway.audit: audit: Drain by token 'operator'"
    forged = f"r1\n{audit}\x1b[2J\x1b]0;x\x07"
    with configured("text") as buffer:
        logs.bind_request_id(forged)
        logging.getLogger("openengine_gateway.core.generation").info("model '%s' not served", "m\r\nx\u2028y")
        logs.bind_request_id("")
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "\x1b" not in lines[0] and "\x07" not in lines[0] and "\r" not in lines[0] and "\u2028" not in lines[0]
    assert "[r1\\n2026-01-01" in lines[0] and "\\x1b[2J" in lines[0] and "'m\\r\\nx\\u2028y'" in lines[0]
