"""The frontend processes' own channel (``--frontends``): each serves ``Peers`` on a unix socket.

The sockets lie in a directory only the supervisor's user can enter, and every call carries the
supervisor's random token (``x-openengine-peer``), compared in constant time: a client of the
gateway cannot reach this service. A call carries its original caller too (``x-openengine-caller``:
the token's name and scope, never the token), so a sibling applies the same ownership rules
(``core.callers``). What ``Peers`` answers comes from the process's own state (``core.peers``' ``*_here``
methods; ``ReloadRoutes`` reloads this process's routes), so nothing is forwarded twice. ``Metrics`` gives
the supervisor this process's metrics, which it merges for the one metrics port (``merged_metrics``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry, generate_latest

from .. import pb
from ..core.callers import Caller, bind_caller, current_caller
from ..core.gateway import Gateway
from ..core.peers import PeeredDiscovery, PeeredLifecycle, PeeredLora
from ..errors import REQUEST_ERRORS, Internal, NotFound, RequestError, Unavailable
from ..reload import RouteReloader
from .routes_servicer import reload_routes
from .servicer import Context, unary

log = logging.getLogger(__name__)

SERVICE = "openengine_gateway.internal.Peers"
TOKEN_KEY = "x-openengine-peer"
CALLER_KEY = "x-openengine-caller"
CALL_TIMEOUT_S = 10.0
"""How long a unary call to a sibling may take (a sibling that does not answer is dead or stuck)."""


def _pack(messages: Sequence[Message]) -> bytes:
    """Several messages as one payload: each length-prefixed."""
    return b"".join(struct.pack(">I", len(data)) + data for data in (m.SerializeToString() for m in messages))


def _unpack_loads(data: bytes) -> list[pb.LoadInfo]:
    loads, position = [], 0
    while position < len(data):
        (size,) = struct.unpack_from(">I", data, position)
        position += 4
        loads.append(pb.LoadInfo.FromString(data[position : position + size]))
        position += size
    return loads


class PeerServer:
    """Serves ``Peers`` for ``gateway`` (built with siblings, its routes reloaded by ``reloader``) on ``unix:path``."""

    def __init__(
        self, gateway: Gateway, reloader: RouteReloader, registry: CollectorRegistry, path: str, token: str
    ) -> None:
        lifecycle, lora, discovery = gateway.lifecycle, gateway.lora, gateway.discovery
        assert isinstance(lifecycle, PeeredLifecycle) and isinstance(lora, PeeredLora)
        assert isinstance(discovery, PeeredDiscovery)
        self._gateway = gateway
        self._reloader = reloader
        self._registry = registry
        self._token = token.encode()
        self._path = path
        self._server = grpc.aio.server()
        unary_methods: dict[str, tuple[Callable[[Any], Any], Callable[[bytes], Any], Callable[[Any], bytes]]] = {
            "Abort": (lifecycle.abort_here, pb.AbortRequest.FromString, pb.AbortResponse.SerializeToString),
            "AbortAll": (self._abort_all, bytes, bytes),
            "LoadLora": (lora.load_here, pb.LoadLoraRequest.FromString, pb.LoadLoraResponse.SerializeToString),
            "UnloadLora": (lora.unload_here, pb.UnloadLoraRequest.FromString, pb.UnloadLoraResponse.SerializeToString),
            "EngineLoads": (self._engine_loads, bytes, bytes),
            "ReloadRoutes": (self._reload_routes, bytes, bytes),
            "Metrics": (self._metrics, bytes, bytes),
        }
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            name: grpc.unary_unary_rpc_method_handler(
                self._unary(handler), request_deserializer=parse, response_serializer=serialize
            )
            for name, (handler, parse, serialize) in unary_methods.items()
        }
        handlers["Drain"] = grpc.unary_stream_rpc_method_handler(
            self._drain,
            request_deserializer=pb.DrainRequest.FromString,
            response_serializer=pb.DrainResponse.SerializeToString,
        )
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def start(self) -> None:
        """Listen on the unix socket."""
        self._server.add_insecure_port(f"unix:{self._path}")
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(1.0)

    async def _admit(self, context: Context) -> None:
        """Refuse a call without the supervisor's token; bind the original caller."""
        metadata = dict(context.invocation_metadata() or ())
        token = metadata.get(TOKEN_KEY, "")
        presented = token.encode() if isinstance(token, str) else token
        if not hmac.compare_digest(presented, self._token):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a frontend of this gateway")
        caller = metadata.get(CALLER_KEY)
        bind_caller(Caller(**json.loads(caller)) if isinstance(caller, str) else Caller())

    def _unary(self, handler: Callable[[Any], Any]) -> Callable[[Any, Context], Any]:
        async def call(request: Any, context: Context) -> Any:
            await self._admit(context)
            return await unary(context, handler, request)

        return call

    async def _drain(self, request: pb.DrainRequest, context: Context) -> AsyncIterator[pb.DrainResponse]:
        await self._admit(context)
        lifecycle = self._gateway.lifecycle
        assert isinstance(lifecycle, PeeredLifecycle)
        async for message in lifecycle.drain_here(request):
            yield message

    async def _abort_all(self, reason: bytes) -> bytes:
        lifecycle = self._gateway.lifecycle
        assert isinstance(lifecycle, PeeredLifecycle)
        return str(await lifecycle.abort_all_here(reason.decode())).encode()

    async def _engine_loads(self, _request: bytes) -> bytes:
        discovery = self._gateway.discovery
        assert isinstance(discovery, PeeredDiscovery)
        return _pack(await discovery.engine_loads_here())

    def _reload_routes(self, _request: bytes) -> bytes:
        reload_routes(self._reloader)
        return b""

    def _metrics(self, _request: bytes) -> bytes:
        """This process's exposition, and when each engine's load it shows was measured."""
        stamps = {model: load.timestamp_unix_nanos for model, load in self._gateway.monitor.load.items()}
        return json.dumps({"exposition": generate_latest(self._registry).decode(), "load_timestamps": stamps}).encode()


class PeerClients:
    """The ``core.peers.Siblings`` of one frontend: its siblings' ``Peers`` over their sockets."""

    def __init__(self, paths: Sequence[str], token: str, here: str) -> None:
        self.here = here
        self._paths = list(paths)
        self._token = token
        self._channels: list[grpc.aio.Channel] = []

    def _calls(self, method: str, *, streaming: bool = False) -> list[Any]:
        if not self._channels:  # made on first use, on the serving event loop
            self._channels = [grpc.aio.insecure_channel(f"unix:{path}") for path in self._paths]
        name = f"/{SERVICE}/{method}"
        if streaming:
            return [channel.unary_stream(name) for channel in self._channels]
        return [channel.unary_unary(name) for channel in self._channels]

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        caller = json.dumps(dataclasses.asdict(current_caller()))
        return ((TOKEN_KEY, self._token), (CALLER_KEY, caller))

    async def _each(self, method: str, request: bytes) -> list[bytes | RequestError]:
        """Every sibling's answer, or the ``RequestError`` it ended with."""
        metadata = self._metadata()

        async def one(call: Any) -> bytes | RequestError:
            try:
                return bytes(await call(request, metadata=metadata, timeout=CALL_TIMEOUT_S))
            except grpc.aio.AioRpcError as error:
                return as_request_error(error)

        return list(await asyncio.gather(*(one(call) for call in self._calls(method))))

    async def abort(self, request: pb.AbortRequest) -> list[pb.AbortResponse | RequestError]:
        return [
            pb.AbortResponse.FromString(answer) if isinstance(answer, bytes) else answer
            for answer in await self._each("Abort", request.SerializeToString())
        ]

    async def abort_all_requests(self, reason: str) -> int:
        answers = await self._each("AbortAll", reason.encode())
        for answer in answers:
            if isinstance(answer, RequestError):
                log.warning("a frontend process did not abort its requests: %s", answer.message)
        return sum(int(answer) for answer in answers if isinstance(answer, bytes))

    def drains(self, request: pb.DrainRequest) -> list[AsyncIterator[pb.DrainResponse]]:
        metadata = self._metadata()
        return [
            _relayed(call(request.SerializeToString(), metadata=metadata))
            for call in self._calls("Drain", streaming=True)
        ]

    async def load_lora(self, request: pb.LoadLoraRequest) -> None:
        _raise_first(await self._each("LoadLora", request.SerializeToString()))

    async def unload_lora(self, request: pb.UnloadLoraRequest) -> None:
        answers = await self._each("UnloadLora", request.SerializeToString())
        _raise_first([answer for answer in answers if not isinstance(answer, NotFound)])  # unloaded there already

    async def engine_loads(self) -> list[list[pb.LoadInfo]]:
        answers = await self._each("EngineLoads", b"")
        _raise_first(answers)
        return [_unpack_loads(answer) for answer in answers if isinstance(answer, bytes)]

    async def reload_routes(self) -> None:
        _raise_first(await self._each("ReloadRoutes", b""))

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


async def _relayed(call: Any) -> AsyncIterator[pb.DrainResponse]:
    try:
        async for data in call:
            yield pb.DrainResponse.FromString(data)
    except grpc.aio.AioRpcError as error:
        raise as_request_error(error) from None


def _raise_first(answers: Sequence[bytes | RequestError]) -> None:
    for answer in answers:
        if isinstance(answer, RequestError):
            raise answer


def as_request_error(error: grpc.aio.AioRpcError) -> RequestError:
    """A sibling's status as the ``RequestError`` it was (UNAVAILABLE: the sibling is gone)."""
    code = error.code()
    if code is grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"a frontend process did not answer: {error.details()}", retry_after_ms=1000)
    return REQUEST_ERRORS.get(code.name, Internal)(error.details() or code.name)


def fetch_metrics(path: str, token: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """One frontend's ``Metrics`` (blocking: the supervisor's metrics thread calls it)."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/Metrics")
        answer = call(b"", metadata=((TOKEN_KEY, token),), timeout=timeout_s)
    result: dict[str, Any] = json.loads(answer)
    return result


__all__ = ["PeerClients", "PeerServer", "as_request_error", "fetch_metrics"]
