"""The later layout (``openengine.v1.Inference`` + ``openengine.v1.Control``) called with the seed's messages.

``LaterStub`` has the seed stub's RPC names; each converts the seed request to the later layout's with
``contract.layouts`` before the call (a request it cannot say is refused with ``NotInLayout`` before
anything is sent) and every answer back to the seed's as it is read. So the client, and everything built on
it (the conformance kit, ``bench``, the ``remote`` driver), has one code path for both layouts; the seed
layout keeps the generated stub itself, with no conversion on its per-token path. Conversion stays out of
gRPC's (de)serializers, which swallow a raised error (grpc.aio sends an empty message, or hands back None).

An RPC the later layout does not have (Embed, Classify, Score, Drain, SubscribeRuntimeEvents) raises
``NotInLayout`` (UNIMPLEMENTED, as the server would answer) without a call. ``GetKvConnectorInfo``, folded
into ``ServerInfo`` there, is answered from GetServerInfo, and ``GetModelInfo`` takes its capacity fields
from ``ServerInfo.capacity``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from .. import pb, pb_later
from ..contract import layouts as convert
from ..errors import InvalidArgument
from .errors import NotInLayout

Layout = Literal["seed", "later"]
"""The seed's one ``OpenEngine`` service (schema ``pb``), or upstream's later two services (``pb_later``)."""

LAYOUTS: tuple[Layout, ...] = ("seed", "later")

W = TypeVar("W", bound=Message)
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Metadata = tuple[tuple[str, str], ...] | None


class GenerateCall(Protocol):
    """A Generate call in flight, read as seed ``GenerateResponse`` messages: grpc.aio's own call on the seed
    layout, ``LaterStreamCall`` on the later one."""

    def __aiter__(self) -> AsyncIterator[pb.GenerateResponse]: ...

    async def read(self) -> object:
        """The next response, or ``grpc.aio.EOF`` after the last."""
        ...

    def cancel(self) -> bool: ...

    def done(self) -> bool: ...

    def add_done_callback(self, callback: Callable[[Any], None]) -> None: ...


class LaterStreamCall(Generic[Resp]):
    """A later-layout server-streaming call whose messages are converted to the seed's as they are read."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, Any], to_seed: Callable[[Any], Resp]) -> None:
        self._call = call
        self._to_seed = to_seed

    def __aiter__(self) -> AsyncIterator[Resp]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Resp]:
        async for message in self._call:
            yield self._to_seed(message)

    async def read(self) -> object:
        """The next converted response, or ``grpc.aio.EOF``."""
        message = await self._call.read()
        return message if message is grpc.aio.EOF else self._to_seed(message)

    def cancel(self) -> bool:
        """Cancel the call (False once it has ended)."""
        return self._call.cancel()

    def done(self) -> bool:
        """Whether the call has ended."""
        return self._call.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Run ``callback(self)`` once the call ends."""
        self._call.add_done_callback(lambda _call: callback(self))


def _same_wire(cls: type[W]) -> Callable[[Message], W]:
    """A message whose bytes mean the same in both layouts, as ``cls``."""
    return lambda message: convert.recast(message, cls)


class _Unary(Generic[Req, Resp]):
    """A later-layout unary RPC taking and answering seed messages."""

    def __init__(self, method: Any, to_later: Callable[[Req], Message], to_seed: Callable[[Any], Resp]) -> None:
        self._method = method
        self._to_later = to_later
        self._to_seed = to_seed

    async def __call__(
        self,
        request: Req,
        *,
        metadata: Metadata = None,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's signature
    ) -> Resp:
        return self._to_seed(await self._method(self._to_later(request), metadata=metadata, timeout=timeout))


class _KvEvents:
    """SubscribeKvEvents: a seed request (same bytes), answers converted as they are read."""

    def __init__(self, method: Any) -> None:
        self._method = method

    def __call__(
        self, request: pb.SubscribeKvEventsRequest, *, metadata: Metadata = None, timeout: float | None = None
    ) -> LaterStreamCall[pb.SubscribeKvEventsResponse]:
        later = convert.recast(request, pb_later.SubscribeKvEventsRequest)
        return LaterStreamCall(
            self._method(later, metadata=metadata, timeout=timeout), convert.kv_events_response_to_seed
        )


class _Generate:
    """Generate: ``priority`` and ``kv.data_parallel_rank`` travel as request metadata in the later layout."""

    def __init__(self, method: Any) -> None:
        self._method = method

    def __call__(
        self, request: pb.GenerateRequest, *, metadata: Metadata = None, timeout: float | None = None
    ) -> LaterStreamCall[pb.GenerateResponse]:
        try:
            later, headers = convert.generate_request_to_later(request)
        except InvalidArgument as exc:  # a field with no place in the later layout (``metadata``)
            raise NotInLayout(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "later") from None
        sent = (*(metadata or ()), *headers) or None
        return LaterStreamCall(self._method(later, metadata=sent, timeout=timeout), convert.generate_response_to_seed)


class _ModelInfo:
    """GetModelInfo: the seed's capacity fields live in the later layout's ``ServerInfo.capacity``."""

    def __init__(self, model_info: Any, server_info: Any) -> None:
        self._model_info = model_info
        self._server_info = server_info

    async def __call__(
        self,
        request: pb.GetModelInfoRequest,
        *,
        metadata: Metadata = None,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's signature
    ) -> pb.ModelInfo:
        later = convert.recast(request, pb_later.GetModelInfoRequest)
        model = await self._model_info(later, metadata=metadata, timeout=timeout)
        server = await self._server_info(pb_later.GetServerInfoRequest(), metadata=metadata, timeout=timeout)
        return convert.model_info_to_seed(model, server.capacity if server.HasField("capacity") else None)


class _KvConnector:
    """GetKvConnectorInfo, which the later layout folds into ``ServerInfo.kv_connector``."""

    def __init__(self, server_info: Any) -> None:
        self._server_info = server_info

    async def __call__(
        self,
        request: pb.GetKvConnectorInfoRequest,
        *,
        metadata: Metadata = None,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's signature
    ) -> pb.KvConnectorInfo:
        server = await self._server_info(pb_later.GetServerInfoRequest(), metadata=metadata, timeout=timeout)
        return convert.kv_connector_to_seed(server.kv_connector)


class _Absent:
    """A seed RPC the later layout does not have."""

    def __init__(self, rpc: str) -> None:
        self._rpc = rpc

    def __call__(self, request: Message, *, metadata: Metadata = None, timeout: float | None = None) -> Any:
        raise NotInLayout(grpc.StatusCode.UNIMPLEMENTED, f"the later layout has no {self._rpc} RPC", "later")


class LaterStub:
    """The seed stub's RPCs over the later layout's two services (see the module docstring)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        inference = pb_later.InferenceStub(channel)
        control = pb_later.ControlStub(channel)
        self.GetServerInfo = control.GetServerInfo
        """The later layout's own ``ServerInfo``, unconverted (its schema revision and release are the later's)."""
        self.Generate = _Generate(inference.Generate)
        self.GetEngineInfo = _Unary(
            control.GetServerInfo, convert.server_info_request_to_later, convert.server_info_to_seed
        )
        self.GetModelInfo = _ModelInfo(control.GetModelInfo, control.GetServerInfo)
        self.GetLoad = _Unary(control.GetLoad, _same_wire(pb_later.GetLoadRequest), convert.load_to_seed)
        self.Health = _Unary(control.Health, _same_wire(pb_later.HealthRequest), convert.health_to_seed)
        self.Abort = _Unary(control.Abort, _same_wire(pb_later.AbortRequest), _same_wire(pb.AbortResponse))
        self.LoadLora = _Unary(control.LoadLora, _same_wire(pb_later.LoadLoraRequest), _same_wire(pb.LoadLoraResponse))
        self.UnloadLora = _Unary(
            control.UnloadLora, _same_wire(pb_later.UnloadLoraRequest), _same_wire(pb.UnloadLoraResponse)
        )
        self.ListLoras = _Unary(
            control.ListLoras, _same_wire(pb_later.ListLorasRequest), _same_wire(pb.ListLorasResponse)
        )
        self.GetKvConnectorInfo = _KvConnector(control.GetServerInfo)
        self.GetKvEventSources = _Unary(
            control.GetKvEventSources,
            _same_wire(pb_later.GetKvEventSourcesRequest),
            _same_wire(pb.GetKvEventSourcesResponse),
        )
        self.SubscribeKvEvents = _KvEvents(control.SubscribeKvEvents)
        self.Embed = _Absent("Embed")
        self.Classify = _Absent("Classify")
        self.Score = _Absent("Score")
        self.Drain = _Absent("Drain")
        self.SubscribeRuntimeEvents = _Absent("SubscribeRuntimeEvents")


__all__ = ["LAYOUTS", "GenerateCall", "LaterStreamCall", "LaterStub", "Layout"]
