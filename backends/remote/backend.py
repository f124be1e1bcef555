"""``RemoteBackend``: one model of another OpenEngine server, served as a local engine.

``start`` connects (failing closed on schema drift), reads the remote's ``EngineInfo`` and
the model's ``ModelInfo`` and advertises exactly those, so the front gateway validates what
the remote would. Requests are restated with ``mapping`` under the same request id; answers
come back through ``responses``. Abort and cancellation propagate: an aborted request is
aborted on the remote, whose CANCELLED finishes and usage reach the client; a request the
client gave up on has its remote call cancelled and is aborted there too. Health, load,
LoRA, KV sessions and both event streams are relayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from openengine_gateway import pb
from openengine_gateway.client import (
    ClientError,
    GenerateCall,
    IncompatibleServer,
    Layout,
    OpenEngineClient,
    StatusError,
)
from openengine_gateway.errors import EngineFailure, Unavailable
from openengine_gateway.spi import (
    Backend,
    Classification,
    ClassifyCall,
    ConfigurationError,
    EmbedCall,
    Embedding,
    EngineFacts,
    EventStream,
    GenerationEvent,
    GenerationRequest,
    HealthCheck,
    KvEventBatch,
    KvEventSource,
    Load,
    LoraAdapter,
    PrefillDone,
    ScoreCall,
    ScoreResult,
    TaskUsage,
    wire,
)

from . import mapping, responses
from .events import KvCursor, publishes, relay_kv, relay_runtime
from .settings import RemoteSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

_CONNECT_RETRY_S = 0.2
_RETRYABLE_CONNECT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_SESSIONS_REMEMBERED = 4096


class RemoteBackend(Backend[RemoteSettings]):
    """Forwards to a model on another OpenEngine server (see the module docstring)."""

    name = "remote"
    Settings = RemoteSettings

    def __init__(self, settings: RemoteSettings) -> None:
        super().__init__(settings)
        self.remote_model = ""
        """The model's name on the remote (``settings.model``, or the remote's only model)."""
        self._client: OpenEngineClient | None = None
        self._calls: dict[str, GenerateCall] = {}
        self._sessions: OrderedDict[str, None] = OrderedDict()
        self._sources: list[KvEventSource] = []
        self._cursor = KvCursor()

    @property
    def client(self) -> OpenEngineClient:
        """The connected client; UNAVAILABLE before ``start`` and after ``stop``."""
        if self._client is None:
            raise Unavailable(f"the remote engine at {self.settings.target} is not connected")
        return self._client

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Connect, and describe the remote model exactly as the remote does."""
        client = await self._connect()
        self._client = client
        try:
            info = client.engine_info or await client.get_engine_info()
            model = await self._model_info(client, info)
            adapters = []
            if model.HasField("supports_lora") and model.supports_lora:
                adapters = await client.list_loras(timeout_s=self.settings.call_timeout_s)
            self._sources = await self._event_sources(client)
            kv_events, runtime_events = await asyncio.gather(self._publishes_kv(), self._publishes_runtime())
        except BaseException:
            self._client = None
            await client.close()
            raise
        log.info(
            "serving %r of the %s engine at %s (%s layout)",
            self.remote_model,
            info.engine_name,
            self.settings.target,
            client.layout,
        )
        return EngineFacts(
            engine_name=info.engine_name,
            engine_version=info.engine_version,
            model=model,
            role=info.role,
            parallelism=info.parallelism,
            kv_connector=info.kv_connector if info.HasField("kv_connector") else None,
            instance_id=info.instance_id,
            lora_adapters=[LoraAdapter(a.lora_id, a.lora_name, a.source_path) for a in adapters],
            shares_filesystem=False,  # adapter paths are the remote host's: the remote checks them
            publishes_kv_events=kv_events,
            publishes_runtime_events=runtime_events,
            reports_cancellation=True,
        )

    async def _connect(self) -> OpenEngineClient:
        """A compatible client, retrying while the remote is not answering yet. With ``layout = auto``, a
        remote that answers the seed's GetEngineInfo UNIMPLEMENTED is asked in the later layout."""
        options = self.settings
        try:
            token = options.bearer_token()
        except ValueError as exc:
            raise ConfigurationError(f"remote {options.target}: {exc}") from None
        roots, chain, key = await asyncio.to_thread(_credentials, options)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.connect_timeout_s
        layout: Layout = "later" if options.layout == "later" else "seed"
        while True:
            try:
                return await OpenEngineClient.connect(
                    options.target,
                    token=token,
                    root_certificates=roots,
                    certificate_chain=chain,
                    private_key=key,
                    tls=options.tls,
                    layout=layout,
                    check_compatibility=options.check_compatibility,
                    timeout_s=max(min(deadline - loop.time(), options.call_timeout_s), _CONNECT_RETRY_S),
                    channel_options=[
                        ("grpc.max_receive_message_length", options.max_message_bytes),
                        ("grpc.max_send_message_length", options.max_message_bytes),
                    ],
                )
            except IncompatibleServer as exc:
                raise ConfigurationError(f"remote {options.target}: {exc}") from None
            except StatusError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED and options.layout == "auto" and layout == "seed":
                    layout = "later"
                    continue
                if exc.code not in _RETRYABLE_CONNECT or loop.time() + _CONNECT_RETRY_S >= deadline:
                    raise ConnectionError(
                        f"the remote OpenEngine server {options.target} is not answering: {exc}"
                    ) from None
            await asyncio.sleep(_CONNECT_RETRY_S)

    async def _model_info(self, client: OpenEngineClient, info: pb.EngineInfo) -> pb.ModelInfo:
        """The remote model's ``ModelInfo``; the model must be named when the remote serves several."""
        served = list(info.supported_models)
        name = self.settings.model or (served[0] if served else "")
        if not name or name not in served:
            raise ConfigurationError(f"remote {self.settings.target} serves {served}; it does not serve {name!r}")
        model = await client.model_info(name, timeout_s=self.settings.call_timeout_s)
        others = set(served) - {model.served_model_name, *model.served_model_aliases}
        if not self.settings.model and others:
            raise ConfigurationError(f"remote {self.settings.target} serves several models {served}: set model")
        self.remote_model = name
        return model

    async def _event_sources(self, client: OpenEngineClient) -> list[KvEventSource]:
        try:
            listed = await client.kv_event_sources(timeout_s=self.settings.call_timeout_s)
            return [wire.kv_source(source) for source in listed]
        except StatusError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                log.warning("the remote did not list its KV event sources: %s", exc)
            return []

    async def _publishes_kv(self) -> bool:
        setting = self.settings.kv_events
        if setting != "auto":
            return setting == "on"
        stream = self.client.kv_events(pb.SubscribeKvEventsRequest(include_snapshot=True))
        return await publishes(stream, self.settings.event_probe_s)

    async def _publishes_runtime(self) -> bool:
        setting = self.settings.runtime_events
        if setting != "auto":
            return setting == "on"
        stream = self.client.runtime_events(pb.SubscribeRuntimeEventsRequest())
        return await publishes(stream, self.settings.event_probe_s)

    async def stop(self) -> None:
        """Cancel what is still running on the remote and close the channel."""
        for call in self._calls.values():
            call.cancel()
        self._calls.clear()
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> EventStream:
        """The remote's stream as events; the remote's verdict on the request arrives with it.

        A remote of the later layout gets no ``metadata``: that layout has no place for it (its own clients
        cannot send any), and the front has used it already (a split's sticky key)."""
        client = self.client
        message = mapping.generate_request(request, self.remote_model)
        if client.layout == "later":
            message.ClearField("metadata")
        return EventStream.from_iterator(self._relay(client, message))

    async def _relay(self, client: OpenEngineClient, message: pb.GenerateRequest) -> AsyncIterator[GenerationEvent]:
        request_id = message.request_id
        outputs = message.sampling.num_sequences if message.sampling.HasField("num_sequences") else 1
        call = client.generate_call(message)
        self._calls[request_id] = call
        accepted = done = False
        finished: set[int] = set()
        try:
            async for response in call:
                accepted = True
                events, failure = responses.generation_events(response)
                kind = response.WhichOneof("event")
                if kind == "finished":
                    finished.add(response.finished.output_index)
                done = failure is not None or kind == "prefill_ready" or len(finished) == outputs
                for event in events:
                    if isinstance(event, PrefillDone):
                        self._remember_session(event.session.session_id)
                    yield event
                if failure is not None:
                    raise failure
                if done:
                    return
            done = True  # the remote ended the stream; the core reports what is missing
        except grpc.aio.AioRpcError as error:
            status = StatusError.from_rpc_error(error)
            if not accepted:
                # Refused: nothing of ours runs there. Aborting the id would hit whoever holds it
                # on the remote (its ALREADY_EXISTS means another client's request).
                done = True
                raise responses.rejection(status.code.name, status.details, status.retry_after_ms) from None
            done = True  # the remote ended the call with that status: nothing of it runs there
            raise responses.stream_failure(status.code.name, status.details) from None
        finally:
            if self._calls.get(request_id) is call:
                if done:
                    self._forget(request_id, call)
                else:  # the front gave up on it: the core aborts it next (``abort``), unless it did already
                    call.cancel()

    async def abort(self, request_id: str) -> None:
        """Abort the request on the remote, whose stream then ends with its terminal events and usage.

        A call the front already gave up on (its client left) is cancelled, and is forgotten only
        once the remote has answered this Abort: the core keeps the id in flight until this returns,
        so no later request with the id can be on the remote yet for the Abort to reach. When the
        remote cannot abort it (it does not know it, or cannot be reached), the call is cancelled
        instead. Idempotent.
        """
        call = self._calls.get(request_id)
        if call is None:
            return
        status = None
        try:
            status = await self._abort_remote(pb.AbortRequest(request_id=request_id))
        finally:
            if status is None:
                call.cancel()
            if call.done():
                self._forget(request_id, call)
            else:  # its relay still reads the remote's terminal events: forget it once it ends, however
                call.add_done_callback(lambda _call: self._forget(request_id, call))

    def _forget(self, request_id: str, call: GenerateCall) -> None:
        if self._calls.get(request_id) is call:
            del self._calls[request_id]

    async def _abort_remote(self, request: pb.AbortRequest) -> pb.AbortStatus.ValueType | None:
        """Abort on the remote; None when it does not know the target (nothing to do)."""
        try:
            return (await self.client.abort(request, timeout_s=self.settings.call_timeout_s)).status
        except ClientError as exc:  # best effort: the request is over for the front either way
            if not (isinstance(exc, StatusError) and exc.code == grpc.StatusCode.NOT_FOUND):
                log.warning("aborting %s on the remote failed: %s", request, exc)
            return None
        except Unavailable:
            return None  # stopped meanwhile

    # -- KV sessions ----------------------------------------------------------------------

    def _remember_session(self, session_id: str) -> None:
        self._sessions[session_id] = None
        if len(self._sessions) > _SESSIONS_REMEMBERED:
            self._sessions.popitem(last=False)

    async def abort_kv_session(self, session_id: str) -> bool:
        """Release the session on the remote; False when the remote does not hold it."""
        self._sessions.pop(session_id, None)
        status = await self._abort_remote(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id=session_id)))
        return status == pb.ABORT_STATUS_ABORTED

    async def abort_all_kv_sessions(self) -> int:
        """Release every session this gateway received from the remote (there is no RPC for all)."""
        sessions, self._sessions = list(self._sessions), OrderedDict()
        released = [await self.abort_kv_session(session_id) for session_id in sessions]
        return sum(released)

    # -- tasks and LoRA -------------------------------------------------------------------

    async def _unary(self, call: Callable[[T], Awaitable[Any]], message: T) -> Any:
        """A remote unary call; its status is the front's. Cancelling it cancels the remote call,
        which aborts it there (never an Abort by id, which could reach a later request using the id)."""
        try:
            return await call(message)
        except StatusError as error:
            raise responses.rejection(error.code.name, error.details, error.retry_after_ms) from None

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        """The remote's embeddings."""
        message = mapping.embed_request(call, self.remote_model)
        response: pb.EmbedResponse = await self._unary(self.client.embed, message)
        return wire.embeddings(response.outputs), wire.usage(response.usage)

    async def classify(self, call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        """The remote's class scores."""
        message = mapping.classify_request(call, self.remote_model)
        response: pb.ClassifyResponse = await self._unary(self.client.classify, message)
        return wire.classifications(response.outputs), wire.usage(response.usage)

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """The remote's scores."""
        message = mapping.score_request(call, self.remote_model)
        response: pb.ScoreResponse = await self._unary(self.client.score, message)
        return wire.score_result(response), wire.usage(response.usage)

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """Load the adapter on the remote (its path must be visible there)."""
        wire = pb.LoraAdapter(lora_id=adapter.lora_id, lora_name=adapter.lora_name, source_path=adapter.source_path)
        await self._unary(self.client.load_lora, wire)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """Unload the adapter on the remote."""
        await self._unary(self.client.unload_lora, adapter.lora_name)

    # -- observability --------------------------------------------------------------------

    async def load(self) -> Load:
        """The remote's load; all unknown while it cannot be asked."""
        try:
            return wire.load(await self.client.load(per_rank=True, timeout_s=self.settings.call_timeout_s))
        except (ClientError, Unavailable) as exc:
            log.warning("the remote's load is unknown: %s", exc)
            return Load()

    async def check_health(self) -> list[HealthCheck]:
        """``remote`` (the remote's overall state), then the remote's own engine checks."""
        target = self.settings.target
        try:
            health = await self.client.health(timeout_s=self.settings.health_timeout_s)
        except (ClientError, Unavailable) as exc:
            return [HealthCheck("remote", pb.HEALTH_STATE_NOT_READY, f"{target}: {exc}")]
        state = pb.HealthState.Name(health.state).removeprefix("HEALTH_STATE_")
        own = wire.health_checks([check for check in health.checks if check.name != "grpc"])
        return [HealthCheck("remote", health.state, f"{target} is {state}"), *own]

    async def inference_probe(self) -> str:
        """The remote's own inference probe, which fits its role (a decode engine takes no
        request without a KV session, so a probe through ``generate`` would be refused there)."""
        request = pb.HealthRequest(include_inference_probe=True, model=self.remote_model)
        try:
            health = await self.client.health(request, timeout_s=self.settings.call_timeout_s)
        except (ClientError, Unavailable) as exc:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"{self.settings.target}: {exc}", retryable=True) from None
        check = next((c for c in health.checks if c.name == "inference_probe"), None)
        if check is None:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, "the remote reported no inference probe")
        if check.state != pb.HEALTH_STATE_READY:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"the remote's probe: {check.message}", retryable=True)
        return f"the remote's probe: {check.message}"

    def kv_event_sources(self) -> list[KvEventSource]:
        """The remote's engine-native publishers, as it listed them at start."""
        return list(self._sources)

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """The remote's KV event batches, resumed exactly across disconnects."""
        options = self.settings
        return relay_kv(
            self.client, self._cursor, retry_s=options.resubscribe_delay_s, timeout_s=options.call_timeout_s
        )

    def runtime_events(self) -> AsyncIterator[pb.RuntimeEvent]:
        """The remote's runtime events, live."""
        return relay_runtime(self.client, retry_s=self.settings.resubscribe_delay_s)


def _credentials(options: RemoteSettings) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The PEM files the settings name (read off the event loop)."""

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return read(options.ca_file), read(options.cert_file), read(options.key_file)


__all__ = ["RemoteBackend"]
