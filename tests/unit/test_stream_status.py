"""The status the interceptor counts for a stream its client leaves: CANCELLED while the call
runs, OK once the stream's terminal response was delivered (Dynamo's worker closes its side
after the final response, before the trailers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from openengine_gateway import pb
from openengine_gateway.server.interceptor import EdgeInterceptor

TOKEN = pb.GenerateResponse(token=pb.TokenOutput(text="a"))
FINAL = pb.GenerateResponse(finished=pb.GenerationFinished(reason=pb.FINISH_REASON_STOP), usage=pb.Usage())
FAILED = pb.GenerateResponse(error=pb.EngineError(message="x"), usage=pb.Usage())
STARTED = pb.DrainResponse(state=pb.DRAIN_STATE_STARTED)
COMPLETE = pb.DrainResponse(state=pb.DRAIN_STATE_COMPLETE)


class _Context:
    """What the interceptor's relay reads of a grpc.aio servicer context."""

    def code(self) -> None:
        return None

    def time_remaining(self) -> None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str], ...] = ()


async def status_after_leaving(rpc: str, message: Message) -> str:
    """The counted status of a ``rpc`` stream whose client leaves right after reading ``message``,
    the servicer then still running (as it does between its last message and its trailers)."""

    async def servicer(_request: object, _context: object) -> AsyncIterator[Message]:
        yield message
        await asyncio.Event().wait()

    counted: list[str] = []
    interceptor = EdgeInterceptor(on_finished=lambda _rpc, code, _token: counted.append(code))

    async def continuation(_details: Any) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_stream_rpc_method_handler(servicer)

    handler = await interceptor.intercept_service(continuation, _Details(f"/{pb.SERVICE_NAME}/{rpc}"))
    assert handler is not None
    stream = handler.unary_stream(object(), _Context())
    assert await stream.__anext__() is message
    await stream.aclose()
    return counted[0]


@pytest.mark.parametrize(("rpc", "message"), [("Generate", FINAL), ("Generate", FAILED), ("Drain", COMPLETE)])
async def test_leaving_after_the_terminal_response_is_ok(rpc: str, message: Message) -> None:
    assert await status_after_leaving(rpc, message) == "OK"


@pytest.mark.parametrize(("rpc", "message"), [("Generate", TOKEN), ("Drain", STARTED)])
async def test_leaving_a_running_stream_is_cancelled(rpc: str, message: Message) -> None:
    assert await status_after_leaving(rpc, message) == "CANCELLED"
