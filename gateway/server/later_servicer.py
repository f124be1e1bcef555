"""The later layout's services, ``openengine.v1.Inference`` and ``openengine.v1.Control``: a thin edge.

Each RPC converts its request to the seed's (``contract.layouts``), calls the seed's servicer, which
holds every rule once (validation, admission, abort, drain, the status of each error), and converts what
comes back. The interceptor in front (auth scopes, size and decode guards, counts) sees these RPCs by
their names, as the seed's. A request the conversion refuses (an ``extra`` key, a field the later layout
does not define) ends INVALID_ARGUMENT before the core sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from .. import pb, pb_later
from ..contract import layouts
from ..core.gateway import Gateway
from ..errors import InvalidArgument, RequestError
from .servicer import Context, OpenEngineServicer, reject, unary

S = TypeVar("S")
L = TypeVar("L")

DETOKENIZE = "detokenize"
"""The one ``extra`` key the edge reads itself, for every engine: ``false`` leaves the text out of each
``TokenOutput`` (token ids only), as TensorRT-LLM's servicer does with it
(``tensorrt_llm/grpc/openengine/request_mapping.py``, ``extra.detokenize``, a boolean). Dynamo 1.6.1's sidecar
sends ``false`` with every request: its frontend detokenizes."""


async def _convert(context: Context, convert: Callable[[L], S], request: L) -> S:
    """``convert(request)``; its ``RequestError`` ends the call with that status."""
    try:
        return convert(request)
    except RequestError as error:
        await reject(context, error)
        raise AssertionError("unreachable") from None


def _detokenize(request: pb_later.GenerateRequest) -> tuple[pb_later.GenerateRequest, bool]:
    """``request`` without ``extra.detokenize``, and whether text is wanted (``InvalidArgument`` unless a boolean)."""
    value = request.extra.fields.get(DETOKENIZE) if request.HasField("extra") else None
    if value is None:
        return request, True
    if value.WhichOneof("kind") != "bool_value":
        raise InvalidArgument(f"extra.{DETOKENIZE} must be a boolean")
    rest = pb_later.GenerateRequest()
    rest.CopyFrom(request)
    del rest.extra.fields[DETOKENIZE]
    if not rest.extra.fields:
        rest.ClearField("extra")
    return rest, value.bool_value


def _headers(context: Context) -> dict[str, str]:
    """The call's text metadata (the later layout's ``openengine-*`` request keys among it)."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


class InferenceServicer(pb_later.InferenceServicer):
    """``openengine.v1.Inference``: Generate, through the seed's servicer."""

    def __init__(self, seed: OpenEngineServicer, gateway: Gateway) -> None:
        self._seed = seed
        self._engines = gateway.engines

    async def Generate(
        self, request: pb_later.GenerateRequest, context: Context
    ) -> AsyncIterator[pb_later.GenerateResponse]:
        headers = _headers(context)
        request, detokenize = await _convert(context, _detokenize, request)
        accepted = self._accepted_extra(request.model) if request.HasField("extra") else frozenset()
        seed_request = await _convert(
            context, lambda r: layouts.generate_request_to_seed(r, headers, accepted_extra=accepted), request
        )
        async for message in self._seed.Generate(seed_request, context):
            later = layouts.generate_response_to_later(message)
            if not detokenize and later.HasField("token"):
                later.token.text = ""
            yield later

    def _accepted_extra(self, model: str) -> frozenset[str]:
        """The ``extra`` keys every engine behind ``model`` accepts (``EngineFacts.accepted_extra``); none for a
        model not served, whose error then comes from the core."""
        try:
            engines = self._engines.route(model).engines
        except RequestError:
            return frozenset()
        return frozenset.intersection(*(engine.facts.accepted_extra for engine in engines))


class ControlServicer(pb_later.ControlServicer):
    """``openengine.v1.Control``: every RPC the seed's servicer has an equivalent of (all ten)."""

    def __init__(self, seed: OpenEngineServicer, gateway: Gateway) -> None:
        self._seed = seed
        self._discovery = gateway.discovery

    async def GetServerInfo(self, request: pb_later.GetServerInfoRequest, context: Context) -> pb_later.ServerInfo:
        seed = await _convert(context, layouts.server_info_request_to_seed, request)
        return await unary(context, self._server_info, seed)

    def _server_info(self, request: pb.GetEngineInfoRequest) -> pb_later.ServerInfo:
        """The seed's ``EngineInfo`` and every served model's ``ModelInfo``, as the later ``ServerInfo``."""
        info = self._discovery.engine_info(request)
        models = [self._discovery.model_info(pb.GetModelInfoRequest(model=name)) for name in info.supported_models]
        return layouts.server_info_to_later(info, models)

    async def GetModelInfo(self, request: pb_later.GetModelInfoRequest, context: Context) -> pb_later.ModelInfo:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.GetModelInfoRequest), request)
        return layouts.model_info_to_later(await self._seed.GetModelInfo(seed, context))

    async def GetLoad(self, request: pb_later.GetLoadRequest, context: Context) -> pb_later.LoadInfo:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.GetLoadRequest), request)
        return layouts.load_to_later(await self._seed.GetLoad(seed, context))

    async def Health(self, request: pb_later.HealthRequest, context: Context) -> pb_later.HealthResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.HealthRequest), request)
        return layouts.health_to_later(await self._seed.Health(seed, context))

    async def Abort(self, request: pb_later.AbortRequest, context: Context) -> pb_later.AbortResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.AbortRequest), request)
        return layouts.recast(await self._seed.Abort(seed, context), pb_later.AbortResponse)

    async def LoadLora(self, request: pb_later.LoadLoraRequest, context: Context) -> pb_later.LoadLoraResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.LoadLoraRequest), request)
        return layouts.recast(await self._seed.LoadLora(seed, context), pb_later.LoadLoraResponse)

    async def UnloadLora(self, request: pb_later.UnloadLoraRequest, context: Context) -> pb_later.UnloadLoraResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.UnloadLoraRequest), request)
        return layouts.recast(await self._seed.UnloadLora(seed, context), pb_later.UnloadLoraResponse)

    async def ListLoras(self, request: pb_later.ListLorasRequest, context: Context) -> pb_later.ListLorasResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.ListLorasRequest), request)
        return layouts.recast(await self._seed.ListLoras(seed, context), pb_later.ListLorasResponse)

    async def GetKvEventSources(
        self, request: pb_later.GetKvEventSourcesRequest, context: Context
    ) -> pb_later.GetKvEventSourcesResponse:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.GetKvEventSourcesRequest), request)
        return layouts.recast(await self._seed.GetKvEventSources(seed, context), pb_later.GetKvEventSourcesResponse)

    async def SubscribeKvEvents(
        self, request: pb_later.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[pb_later.SubscribeKvEventsResponse]:
        seed = await _convert(context, lambda r: layouts.request_to_seed(r, pb.SubscribeKvEventsRequest), request)
        async for message in self._seed.SubscribeKvEvents(seed, context):
            yield layouts.kv_events_response_to_later(message)


__all__ = ["ControlServicer", "InferenceServicer"]
