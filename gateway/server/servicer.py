"""The gRPC servicer: a thin edge from ``openengine.v1.OpenEngine`` to the gateway core.

This is the one place where a ``RequestError`` becomes a gRPC status (with a
``retry-after-ms`` trailing entry when it carries a hint). Streams relay the core's
messages; the core guarantees that no ``RequestError`` surfaces once a stream has sent a
message, so an accepted stream always ends with status OK.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar, cast

import grpc
from google.protobuf.message import Message

from .. import pb
from ..contract.layouts import refuse_unknown_fields
from ..core.gateway import Gateway
from ..errors import RequestError, ResourceExhausted, bounded_message

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
"""The call context of any RPC (its request and response types are not used here)."""


async def reject(context: Context, error: RequestError) -> None:
    """End the call with ``error``'s status (raises, as ``context.abort`` does)."""
    if error.retry_after_ms is not None:
        context.set_trailing_metadata((("retry-after-ms", str(error.retry_after_ms)),))
    await context.abort(grpc.StatusCode[error.status.name], bounded_message(error.message))


async def unary(
    context: Context, handler: Callable[[R], Awaitable[T] | T], request: R, *, max_bytes: int | None = None
) -> T:
    """Run a core handler (sync or async); its ``RequestError`` becomes the call's status.

    A response over ``max_bytes`` is RESOURCE_EXHAUSTED here: gRPC would refuse to send it only
    after the handler returned, so the call would be counted OK and logged as a server error."""
    try:
        result = handler(request)
        if inspect.isawaitable(result):
            result = await result
        if max_bytes is not None and isinstance(result, Message) and (size := result.ByteSize()) > max_bytes:
            raise ResourceExhausted(
                f"the response is {size} bytes, more than this gateway's {max_bytes}-byte message limit; "
                "ask for less (fewer items, fewer candidates) or raise --max-message-bytes"
            )
        return cast(T, result)
    except RequestError as error:
        await reject(context, error)
        raise AssertionError("unreachable") from None
    except Exception:  # broad on purpose: a bug must be INTERNAL with a message, not UNKNOWN
        log.exception("unexpected failure in a unary call")
        await context.abort(grpc.StatusCode.INTERNAL, "internal gateway error")
        raise


async def _stream(context: Context, messages: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        async for message in messages:
            yield message
    except RequestError as error:
        await reject(context, error)
    except Exception:  # broad on purpose: see unary
        log.exception("unexpected failure in a streaming call")
        await context.abort(grpc.StatusCode.INTERNAL, "internal gateway error")


class OpenEngineServicer(pb.OpenEngineServicer):
    """Every RPC of ``openengine.v1.OpenEngine``, delegated to ``Gateway``."""

    def __init__(self, gateway: Gateway, *, max_message_bytes: int | None = None) -> None:
        self._gateway = gateway
        self._max_bytes = max_message_bytes

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> AsyncIterator[pb.GenerateResponse]:
        try:
            refuse_unknown_fields(request, "seed")  # the later layout's bytes on this path: docs/layouts.md
        except RequestError as error:
            await reject(context, error)
        async for message in _stream(context, self._gateway.generation.generate(request)):
            yield message

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        return await unary(context, self._gateway.tasks.embed, request, max_bytes=self._max_bytes)

    async def Classify(self, request: pb.ClassifyRequest, context: Context) -> pb.ClassifyResponse:
        return await unary(context, self._gateway.tasks.classify, request, max_bytes=self._max_bytes)

    async def Score(self, request: pb.ScoreRequest, context: Context) -> pb.ScoreResponse:
        return await unary(context, self._gateway.tasks.score, request, max_bytes=self._max_bytes)

    async def GetEngineInfo(self, request: pb.GetEngineInfoRequest, context: Context) -> pb.EngineInfo:
        return await unary(context, self._gateway.discovery.engine_info, request)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Context) -> pb.ModelInfo:
        return await unary(context, self._gateway.discovery.model_info, request)

    async def GetLoad(self, request: pb.GetLoadRequest, context: Context) -> pb.LoadInfo:
        return await unary(context, self._gateway.discovery.load, request)

    async def Health(self, request: pb.HealthRequest, context: Context) -> pb.HealthResponse:
        return await unary(context, self._gateway.lifecycle.health, request)

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        return await unary(context, self._gateway.lifecycle.abort, request)

    async def Drain(self, request: pb.DrainRequest, context: Context) -> AsyncIterator[pb.DrainResponse]:
        async for message in _stream(context, self._gateway.lifecycle.drain(request)):
            yield message

    async def LoadLora(self, request: pb.LoadLoraRequest, context: Context) -> pb.LoadLoraResponse:
        return await unary(context, self._gateway.lora.load, request)

    async def UnloadLora(self, request: pb.UnloadLoraRequest, context: Context) -> pb.UnloadLoraResponse:
        return await unary(context, self._gateway.lora.unload, request)

    async def ListLoras(self, request: pb.ListLorasRequest, context: Context) -> pb.ListLorasResponse:
        return await unary(context, self._gateway.lora.list, request)

    async def GetKvConnectorInfo(self, request: pb.GetKvConnectorInfoRequest, context: Context) -> pb.KvConnectorInfo:
        return await unary(context, self._gateway.discovery.kv_connector, request)

    async def GetKvEventSources(
        self, request: pb.GetKvEventSourcesRequest, context: Context
    ) -> pb.GetKvEventSourcesResponse:
        return await unary(context, self._gateway.discovery.kv_event_sources, request)

    async def SubscribeKvEvents(
        self, request: pb.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[pb.SubscribeKvEventsResponse]:
        async for message in _stream(context, self._gateway.events.subscribe_kv(request)):
            yield message

    async def SubscribeRuntimeEvents(
        self, request: pb.SubscribeRuntimeEventsRequest, context: Context
    ) -> AsyncIterator[pb.SubscribeRuntimeEventsResponse]:
        async for message in _stream(context, self._gateway.events.subscribe_runtime(request)):
            yield message


__all__ = ["OpenEngineServicer", "reject", "unary"]
