"""Shared pieces of the operations proofs: one valid call per RPC, and how to run one.

``CALLS`` holds one call of every OpenEngine RPC (17), plus Abort of all requests, each with
the scope its token needs (control, observe, or else inference; discovery calls are marked too).
``outcome`` runs a call and reports its status code; a stream that is still open after a moment
counts as admitted (``OPEN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.testing import RunningGateway, serve_backends

OPEN = "OPEN"
"""A stream that was admitted and is still running."""

_ids = itertools.count()


@dataclass(frozen=True)
class Call:
    """One RPC invocation: its name, whether it streams, the scope it needs, its request."""

    rpc: str
    streaming: bool
    control: bool
    request: Callable[[Path], Any]
    observe: bool = False
    """Needs an observer (or control) token: the event streams."""
    discovery: bool = False
    """Any valid token reaches it."""

    @property
    def label(self) -> str:
        return f"{self.rpc}{'(all)' if self.rpc == 'Abort' and self.control else ''}"


def _context() -> pb.TaskRequestContext:
    return pb.TaskRequestContext(request_id=f"ops-{next(_ids)}", model="mock")


def _score() -> pb.ScoreRequest:
    group = pb.ScoreGroup(
        group_id="g", query=pb.TaskInput(item_id="q", text="x"), candidates=[pb.TaskInput(item_id="c", text="y")]
    )
    return pb.ScoreRequest(context=_context(), groups=[group])


CALLS: tuple[Call, ...] = (
    Call("Generate", True, False, lambda _: pb.GenerateRequest(model="mock", prompt="hi", stopping=_stop(2))),
    Call("Embed", False, False, lambda _: pb.EmbedRequest(context=_context(), inputs=[_item()])),
    Call("Classify", False, False, lambda _: pb.ClassifyRequest(context=_context(), inputs=[_item()])),
    Call("Score", False, False, lambda _: _score()),
    Call("GetEngineInfo", False, False, lambda _: pb.GetEngineInfoRequest(), discovery=True),
    Call("GetModelInfo", False, False, lambda _: pb.GetModelInfoRequest(model="mock"), discovery=True),
    Call("GetLoad", False, False, lambda _: pb.GetLoadRequest(), discovery=True),
    Call("Health", False, False, lambda _: pb.HealthRequest(), discovery=True),
    Call("Abort", False, False, lambda _: pb.AbortRequest(request_id="no-such-request")),
    Call("Abort", False, True, lambda _: pb.AbortRequest(all_requests=pb.AllRequests())),
    Call("Drain", True, True, lambda _: pb.DrainRequest()),
    Call("LoadLora", False, True, lambda root: pb.LoadLoraRequest(adapter=_adapter(root))),
    Call("UnloadLora", False, True, lambda _: pb.UnloadLoraRequest(lora_name="ops-adapter")),
    Call("ListLoras", False, False, lambda _: pb.ListLorasRequest(), discovery=True),
    Call("GetKvConnectorInfo", False, False, lambda _: pb.GetKvConnectorInfoRequest(), discovery=True),
    Call("GetKvEventSources", False, False, lambda _: pb.GetKvEventSourcesRequest(), discovery=True),
    Call("SubscribeKvEvents", True, False, lambda _: pb.SubscribeKvEventsRequest(), observe=True),
    Call("SubscribeRuntimeEvents", True, False, lambda _: pb.SubscribeRuntimeEventsRequest(), observe=True),
)


def _stop(max_tokens: int) -> pb.StoppingOptions:
    return pb.StoppingOptions(max_tokens=max_tokens)


def _item() -> pb.TaskInput:
    return pb.TaskInput(item_id="a", text="x")


def _adapter(root: Path) -> pb.LoraAdapter:
    path = root / "ops-adapter"
    path.mkdir(exist_ok=True)
    return pb.LoraAdapter(lora_id=7, lora_name="ops-adapter", source_path=str(path))


async def outcome(
    stub: pb.OpenEngineStub,
    call: Call,
    lora_root: Path,
    *,
    metadata: Sequence[tuple[str, str]] = (),
    settle_s: float = 0.3,
) -> str:
    """The call's final status code name, or ``OPEN`` for a stream still running after ``settle_s``."""
    method = getattr(stub, call.rpc)
    request = call.request(lora_root)
    if not call.streaming:
        try:
            await method(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return "OK"
    stream = method(request, metadata=metadata, timeout=10)

    async def finish() -> str:
        try:
            async for _ in stream:
                pass
        except grpc.aio.AioRpcError as error:
            return str(error.code().name)
        return "OK"

    try:
        return await asyncio.wait_for(finish(), settle_s)
    except TimeoutError:
        return OPEN
    finally:
        stream.cancel()


def mock(**settings: Any) -> MockBackend:
    """A mock engine with ``settings`` over its defaults."""
    return MockBackend(MockSettings(**settings))


@contextlib.asynccontextmanager
async def gateway(
    *,
    options: GatewayOptions = GatewayOptions(),
    server: ServerOptions | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    **settings: Any,
) -> AsyncIterator[RunningGateway]:
    """One mock engine served as ``mock`` by an in-process gateway on a free loopback port."""
    async with serve_backends(
        [("mock", mock(**settings))], options=options, server_options=server, credentials=credentials
    ) as running:
        yield running


async def wait_until(condition: Callable[[], bool], within_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``condition`` every 10 ms until true; fail after ``within_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not hold within {within_s}s")
        await asyncio.sleep(0.01)


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (for a server that takes a fixed port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def engine_idle(backend: MockBackend) -> bool:
    """The mock runs and queues nothing and no KV block is referenced, on every rank."""
    return all(not core.running and not core.waiting and core.kv.used == 0 for core in backend.cores)


__all__ = ["CALLS", "OPEN", "Call", "engine_idle", "free_port", "gateway", "mock", "outcome", "wait_until"]
