"""An async OpenEngine client over the generated stubs, that fails closed on schema drift.

    async with await OpenEngineClient.connect("127.0.0.1:50051") as client:
        completion = await client.generate(text_request("Hello", max_tokens=16))
        print(completion.outputs[0].text, completion.usage.completion_tokens)

``connect`` reads ``EngineInfo`` and refuses a server whose schema revision, minimum client
revision or schema release is outside what this client was tested with. Errors are
exceptions: ``StatusError`` for a non-OK status, ``EngineErrorEvent`` for a terminal
``EngineError`` in an accepted stream.

``layout="later"`` speaks upstream's later ``Inference``/``Control`` services instead of the seed's
``OpenEngine`` (``layouts.LaterStub``): the client's methods still take and return the seed's messages
(``GetServerInfo`` read as ``EngineInfo``), and an RPC that layout lacks raises ``NotInLayout``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from .. import pb, pb_later
from ..contract import layouts as convert
from .errors import EngineErrorEvent, IncompatibleServer, StatusError
from .layouts import GenerateCall, LaterStub, Layout

CLIENT_REVISION = 1
"""The contract revision this client implements."""

TESTED_SERVER_REVISIONS = (1, 1)
"""Oldest and newest server schema revision this client was tested against."""

TESTED_RELEASES = {1: frozenset({pb.SCHEMA_RELEASE})}
"""Schema releases (immutable upstream commits) tested, per revision."""

TESTED_LATER = ((1, 1), {1: frozenset({pb_later.SCHEMA_RELEASE})})
"""The later layout's tested server revisions and releases (its own count: upstream restarted it at 1)."""


def check_compatible(info: pb.EngineInfo | pb_later.ServerInfo) -> None:
    """Raise ``IncompatibleServer`` unless ``info`` is inside the tested compatibility range: the seed's
    ``EngineInfo``, or the later layout's ``ServerInfo`` against that layout's own range."""
    revision = info.schema_revision
    tested = (TESTED_SERVER_REVISIONS, TESTED_RELEASES) if isinstance(info, pb.EngineInfo) else TESTED_LATER
    (oldest, newest), releases = tested
    if revision == 0:
        raise IncompatibleServer("the server reports schema_revision 0, which is invalid")
    if not oldest <= revision <= newest:
        raise IncompatibleServer(f"server schema revision {revision} is outside the tested range {oldest}..{newest}")
    if info.minimum_client_revision > CLIENT_REVISION:
        raise IncompatibleServer(
            f"the server requires client revision {info.minimum_client_revision}; this client is {CLIENT_REVISION}"
        )
    if info.schema_release not in releases.get(revision, frozenset()):
        raise IncompatibleServer(f"server schema release {info.schema_release!r} was not tested with this client")


def text_request(
    prompt: str | Sequence[int], *, model: str = "", request_id: str = "", **options: Any
) -> pb.GenerateRequest:
    """A ``GenerateRequest`` from a prompt (text or token ids) and flat options.

    Options name fields of the request's groups: ``max_tokens``, ``temperature``, ``seed``,
    ``num_sequences``, ``ignore_eos``, ``stop`` (list of strings), ``return_output_logprobs``...
    """
    request = pb.GenerateRequest(model=model, request_id=request_id)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.token_ids.ids.extend(prompt)
    stops = options.pop("stop", ())
    for stop in (stops,) if isinstance(stops, str) else stops:  # one string is one stop, not its characters
        request.stopping.conditions.add(stop_text=stop)
    groups = (request.sampling, request.stopping, request.response, request.kv)
    for name, value in options.items():
        group = next((g for g in groups if name in g.DESCRIPTOR.fields_by_name), None)
        if group is None:
            raise TypeError(f"unknown generation option {name!r}")
        setattr(group, name, value)
    return request


@dataclass
class Output:
    """One finished output of a generation."""

    index: int
    tokens: list[pb.TokenInfo] = field(default_factory=list)
    text: str = ""
    finish_reason: int = pb.FINISH_REASON_UNSPECIFIED
    stop_match: pb.StopMatch | None = None
    message: str = ""

    @property
    def token_ids(self) -> list[int]:
        """The generated token ids."""
        return [t.token_id for t in self.tokens]


@dataclass
class Completion:
    """Everything a Generate stream returned, collected."""

    request_id: str
    outputs: list[Output]
    prompt: list[pb.TokenInfo]
    usage: pb.Usage
    kv_session: pb.KvSessionRef | None = None
    messages: int = 0


class OpenEngineClient:
    """Typed helpers for every OpenEngine RPC over one channel, in either layout."""

    def __init__(self, channel: grpc.aio.Channel, *, token: str | None = None, layout: Layout = "seed") -> None:
        self.channel = channel
        self.layout: Layout = layout
        self.stub = pb.OpenEngineStub(channel)
        """The seed service's generated stub (for calls the helpers do not make)."""
        self._rpc = self.stub if layout == "seed" else LaterStub(channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.engine_info: pb.EngineInfo | None = None

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        tls: bool = False,
        check_compatibility: bool = True,
        timeout_s: float = 10.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        layout: Layout = "seed",
    ) -> OpenEngineClient:
        """Open a channel and check compatibility.

        ``layout`` picks the services spoken (the seed's, or upstream's later ones). TLS when ``tls``
        is set or any certificate is given (the system's roots without ``root_certificates``).
        ``channel_options`` are gRPC channel arguments, such as ``("grpc.max_receive_message_length", n)``.
        """
        options = list(channel_options)
        if tls or root_certificates or certificate_chain:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        client = cls(channel, token=token, layout=layout)
        try:
            info = await client.identity(timeout_s=timeout_s)
            if check_compatibility:
                check_compatible(info)
            client.engine_info = info if isinstance(info, pb.EngineInfo) else convert.server_info_to_seed(info)
        except BaseException:
            await channel.close()
            raise
        return client

    async def identity(self, *, timeout_s: float | None = None) -> pb.EngineInfo | pb_later.ServerInfo:
        """The layout's own identity message, unconverted: ``EngineInfo``, or the later layout's ``ServerInfo``,
        whose schema revision and release are that layout's (what compatibility is checked against)."""
        if isinstance(self._rpc, LaterStub):
            request = pb_later.GetServerInfoRequest()
            info: pb_later.ServerInfo = await self._unary(self._rpc.GetServerInfo, request, timeout_s)
            return info
        return await self.get_engine_info(timeout_s=timeout_s)

    @property
    def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """What every call sends (the bearer token), for calls made on ``stub`` directly."""
        return self._metadata

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def __aenter__(self) -> OpenEngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise StatusError.from_rpc_error(error) from None

    async def _stream(self, method: Any, request: Any, timeout_s: float | None) -> AsyncIterator[Any]:
        """The call's messages; a caller that stops reading early (``break``, ``aclose``) cancels the
        call, so the server stops its work instead of running it to the end for nobody."""
        call = method(request, metadata=self._metadata, timeout=timeout_s)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as error:
            raise StatusError.from_rpc_error(error) from None
        finally:
            call.cancel()  # a no-op once the call has ended

    # -- generation -----------------------------------------------------------------------

    def stream(
        self, request: pb.GenerateRequest, *, timeout_s: float | None = None
    ) -> AsyncIterator[pb.GenerateResponse]:
        """The raw response stream (an ``EngineError`` event is yielded, not raised)."""
        return self._stream(self._rpc.Generate, request, timeout_s)

    def generate_call(self, request: pb.GenerateRequest, *, timeout_s: float | None = None) -> GenerateCall:
        """The Generate call itself, for a caller that reads it at its own pace, cancels it or waits for its
        end; its errors are grpc's (``StatusError.from_rpc_error`` wraps one)."""
        call: GenerateCall = self._rpc.Generate(request, metadata=self._metadata, timeout=timeout_s)
        return call

    async def generate(self, request: pb.GenerateRequest, *, timeout_s: float | None = None) -> Completion:
        """Run a generation to its end and collect it; a terminal error raises ``EngineErrorEvent``."""
        outputs: dict[int, Output] = {}
        completion = Completion(request.request_id, [], [], pb.Usage())
        async for message in self.stream(request, timeout_s=timeout_s):
            completion.request_id = message.request_id
            completion.messages += 1
            kind = message.WhichOneof("event")
            if kind == "token":
                output = outputs.setdefault(message.token.output_index, Output(message.token.output_index))
                output.tokens.extend(message.token.tokens)
                output.text += message.token.text
            elif kind == "finished":
                finished = message.finished
                output = outputs.setdefault(finished.output_index, Output(finished.output_index))
                output.finish_reason = finished.reason
                output.message = finished.message
                output.stop_match = finished.stop_match if finished.HasField("stop_match") else None
            elif kind == "prompt":
                completion.prompt = list(message.prompt.tokens)
            elif kind == "prefill_ready":
                completion.kv_session = message.prefill_ready.kv_session
            elif kind == "error":
                raise EngineErrorEvent(message.error)
            if message.HasField("usage"):
                completion.usage = message.usage
        completion.outputs = [outputs[i] for i in sorted(outputs)]
        return completion

    # -- tasks ----------------------------------------------------------------------------

    async def embed(self, request: pb.EmbedRequest, *, timeout_s: float | None = None) -> pb.EmbedResponse:
        """Embeddings for every input."""
        response: pb.EmbedResponse = await self._unary(self._rpc.Embed, request, timeout_s)
        return response

    async def classify(self, request: pb.ClassifyRequest, *, timeout_s: float | None = None) -> pb.ClassifyResponse:
        """Class scores for every input."""
        response: pb.ClassifyResponse = await self._unary(self._rpc.Classify, request, timeout_s)
        return response

    async def score(self, request: pb.ScoreRequest, *, timeout_s: float | None = None) -> pb.ScoreResponse:
        """Scores for every candidate of every group."""
        response: pb.ScoreResponse = await self._unary(self._rpc.Score, request, timeout_s)
        return response

    # -- metadata and lifecycle -----------------------------------------------------------

    async def get_engine_info(self, *, timeout_s: float | None = None) -> pb.EngineInfo:
        """The server's identity and schema revision."""
        info: pb.EngineInfo = await self._unary(self._rpc.GetEngineInfo, pb.GetEngineInfoRequest(), timeout_s)
        return info

    async def model_info(self, model: str, *, timeout_s: float | None = None) -> pb.ModelInfo:
        """What ``model`` advertises."""
        info: pb.ModelInfo = await self._unary(self._rpc.GetModelInfo, pb.GetModelInfoRequest(model=model), timeout_s)
        return info

    async def load(self, *, per_rank: bool = False, timeout_s: float | None = None) -> pb.LoadInfo:
        """A load snapshot."""
        load: pb.LoadInfo = await self._unary(
            self._rpc.GetLoad, pb.GetLoadRequest(include_per_rank=per_rank), timeout_s
        )
        return load

    async def health(
        self, request: pb.HealthRequest | None = None, *, timeout_s: float | None = None
    ) -> pb.HealthResponse:
        """Health, optionally with an inference probe."""
        response: pb.HealthResponse = await self._unary(self._rpc.Health, request or pb.HealthRequest(), timeout_s)
        return response

    async def abort(self, request: pb.AbortRequest, *, timeout_s: float | None = None) -> pb.AbortResponse:
        """Abort a request, a KV session, or everything."""
        response: pb.AbortResponse = await self._unary(self._rpc.Abort, request, timeout_s)
        return response

    def drain(self, request: pb.DrainRequest, *, timeout_s: float | None = None) -> AsyncIterator[pb.DrainResponse]:
        """Drain progress until COMPLETE or a terminal error event."""
        return self._stream(self._rpc.Drain, request, timeout_s)

    async def load_lora(self, adapter: pb.LoraAdapter, *, timeout_s: float | None = None) -> pb.LoadLoraResponse:
        """Load a LoRA adapter."""
        request = pb.LoadLoraRequest(adapter=adapter)
        response: pb.LoadLoraResponse = await self._unary(self._rpc.LoadLora, request, timeout_s)
        return response

    async def unload_lora(self, name: str, *, timeout_s: float | None = None) -> pb.UnloadLoraResponse:
        """Unload a LoRA adapter by name."""
        request = pb.UnloadLoraRequest(lora_name=name)
        response: pb.UnloadLoraResponse = await self._unary(self._rpc.UnloadLora, request, timeout_s)
        return response

    async def list_loras(self, *, timeout_s: float | None = None) -> list[pb.LoraAdapter]:
        """Loaded LoRA adapters."""
        response: pb.ListLorasResponse = await self._unary(self._rpc.ListLoras, pb.ListLorasRequest(), timeout_s)
        return list(response.adapters)

    async def kv_connector(self, *, timeout_s: float | None = None) -> pb.KvConnectorInfo:
        """The KV connector description."""
        info: pb.KvConnectorInfo = await self._unary(
            self._rpc.GetKvConnectorInfo, pb.GetKvConnectorInfoRequest(), timeout_s
        )
        return info

    async def kv_event_sources(
        self, ranks: Sequence[int] = (), *, timeout_s: float | None = None
    ) -> list[pb.KvEventSource]:
        """Engine-native KV event publishers."""
        request = pb.GetKvEventSourcesRequest(data_parallel_ranks=ranks)
        response: pb.GetKvEventSourcesResponse = await self._unary(self._rpc.GetKvEventSources, request, timeout_s)
        return list(response.sources)

    def kv_events(
        self, request: pb.SubscribeKvEventsRequest, *, timeout_s: float | None = None
    ) -> AsyncIterator[pb.SubscribeKvEventsResponse]:
        """KV event batches (a terminal error event is yielded, not raised)."""
        return self._stream(self._rpc.SubscribeKvEvents, request, timeout_s)

    def runtime_events(
        self, request: pb.SubscribeRuntimeEventsRequest, *, timeout_s: float | None = None
    ) -> AsyncIterator[pb.SubscribeRuntimeEventsResponse]:
        """Runtime events (a terminal error event is yielded, not raised)."""
        return self._stream(self._rpc.SubscribeRuntimeEvents, request, timeout_s)


__all__ = [
    "CLIENT_REVISION",
    "TESTED_RELEASES",
    "TESTED_SERVER_REVISIONS",
    "Completion",
    "OpenEngineClient",
    "Output",
    "check_compatible",
    "text_request",
]
