"""The backend SPI: the one interface a driver implements, in tree or in a plugin.

A driver is a ``Backend`` subclass registered under the ``openengine.backends`` entry-point
group. The gateway creates it with its validated ``Settings``, calls ``start`` once, serves
requests, and calls ``stop`` once. Four methods are abstract; everything optional (tasks,
LoRA, KV sessions, KV and runtime events, load, health) has a default that reports "not
supported", and the driver advertises what it overrides in ``EngineFacts.model`` (a
``ModelInfo``) and the ``EngineFacts`` flags. The core enforces those facts before it calls
the driver, so a driver never sees a request for something it did not advertise.

Versioning: ``SPI_VERSION`` changes when this interface changes incompatibly. A driver
declares the version it was written for in ``Backend.spi_version``; the gateway refuses to
load one that differs, with a message naming the driver.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from .. import pb
from ..errors import ConfigurationError, Unimplemented
from .events import EventStream
from .frontends import SharedEngine
from .kv_events import KvEventBatch, KvEventSource
from .requests import ClassifyCall, EmbedCall, GenerationRequest, LoraAdapter, ScoreCall
from .results import Classification, Embedding, HealthCheck, Load, ScoreResult, TaskUsage

SPI_VERSION = 2
"""The backend SPI revision this gateway implements. 2: ``generate`` returns an ``EventStream``;
tasks, load, health and KV events are SPI values, not wire messages; ``Backend[SettingsT]``."""


class BackendSettings(BaseModel):
    """Base of a driver's settings model: unknown keys are errors that name the key.

    ``model`` is the model path or id the engine loads; a driver's subclass adds its own
    options (validated by pydantic, from ``plugins.toml`` or command-line flags).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str = ""


@dataclass
class EngineFacts:
    """What a started engine is: identity, role, parallelism and its model's capabilities.

    ``model`` is the truth table for discovery *and* enforcement: ``GetModelInfo`` returns it
    (with the served name and aliases filled in by the gateway) and the core rejects every
    explicit request option it does not advertise. Presence matters: leave a limit unset
    when the engine cannot report it; set ``False`` when a feature is known to be missing.
    """

    engine_name: str
    engine_version: str
    model: pb.ModelInfo
    role: pb.EngineRole.ValueType = pb.ENGINE_ROLE_AGGREGATED
    parallelism: pb.ParallelismInfo = field(default_factory=pb.ParallelismInfo)
    kv_connector: pb.KvConnectorInfo | None = None
    instance_id: str = ""
    lora_adapters: Sequence[LoraAdapter] = ()
    """Adapters the engine was started with; the gateway's registry begins with them."""
    shares_filesystem: bool = True
    """The engine reads files (LoRA adapters) from the gateway's own filesystem, so the gateway
    resolves their paths and checks that they exist. False for an engine on another host (a
    proxy's remote), which checks its own paths."""
    publishes_kv_events: bool = False
    """``kv_events`` yields the engine's KV cache events."""
    publishes_runtime_events: bool = False
    """``runtime_events`` yields scheduler and transfer events."""
    supports_abort: bool = True
    """``abort`` stops a running request; without it ``Abort`` answers UNIMPLEMENTED."""
    reports_cancellation: bool = False
    """After ``abort`` the request's stream ends with the engine's own terminal events (CANCELLED
    finishes with usage), as a proxy's remote engine sends them; the core waits a few seconds
    for them instead of ending the stream itself, so the client gets the engine's usage."""
    tokenizer_id: str | None = None
    """An identity of the engine's tokenizer: a digest of its vocabulary and special tokens
    (``spi.vocabulary_digest``). Engines with equal ids read token ids alike, so a name split
    across them may take token ids; ``None`` (unknown) counts as different from every id."""
    accepted_extra: frozenset[str] = frozenset()
    """Keys of the later OpenEngine layout's ``GenerateRequest.extra`` this driver reads (docs/layouts.md): each
    reaches ``GenerationRequest.metadata`` as ``extra.<key>``, its value as JSON. Any other key is refused by
    name (as is one that not every engine behind a split accepts), never ignored."""


SettingsT = TypeVar("SettingsT", bound=BackendSettings)
"""A driver's own settings model: ``class MyBackend(Backend[MySettings])``."""


class Backend(ABC, Generic[SettingsT]):
    """One inference engine serving one model.

    Subclasses name their settings model twice, as the type parameter (so ``self.settings``
    has its type) and as ``Settings`` (the class the gateway validates options with):
    ``class MyBackend(Backend[MySettings])`` with ``Settings = MySettings``. They set ``name``
    (the entry-point name) and implement the abstract methods. Everything runs on the
    gateway's event loop: never block it (run blocking native calls in a thread or the
    engine's own loop).
    """

    name: ClassVar[str] = ""
    spi_version: ClassVar[int] = SPI_VERSION
    Settings: ClassVar[type[BackendSettings]] = BackendSettings
    process_exclusive: ClassVar[str] = ""
    """Why this engine cannot share the gateway's process with another engine (process-wide
    state, a shutdown that kills every child process of the gateway), or ``""`` when it can.
    The gateway then refuses, before anything starts, to serve it beside another engine."""

    @classmethod
    def share(cls, settings: BackendSettings, frontends: int) -> SharedEngine:
        """Start the engine ``settings`` describe once, for ``frontends`` gateway processes
        (``--frontends N``; ``spi.frontends``), and return it with one attachment per process.

        Called in the supervisor, which has started no other engine for it; blocking (it runs in a
        thread). Override it together with ``attach``; the default refuses, and the gateway then
        refuses ``--frontends`` above 1 before anything starts. Each frontend process then makes its
        own instance, calls ``attach`` and ``start``, and serves as usual: everything an instance
        does to the engine (``load_lora``, ``unload_lora``, ``abort_kv_session``...) is done by
        every frontend, so it must be idempotent engine-side.
        """
        raise ConfigurationError(f"backend {cls.name!r} cannot serve from several frontend processes (--frontends)")

    @classmethod
    def can_share(cls) -> bool:
        """Whether this driver overrides ``share`` (and so serves ``--frontends`` above 1)."""
        return cls.share.__func__ is not Backend.share.__func__  # type: ignore[attr-defined]

    def attach(self, attachment: object) -> None:
        """In a frontend process, before ``start``: ``start`` is then to connect to the engine the
        supervisor started (``share``), which ``attachment`` (one of its ``attachments``) describes,
        rather than start one; ``stop`` leaves that engine running."""
        raise ConfigurationError(f"backend {self.name!r} cannot serve from several frontend processes (--frontends)")

    def __init__(self, settings: SettingsT) -> None:
        if not isinstance(settings, self.Settings):  # the gateway validates with Settings; a test may not
            raise TypeError(f"{type(self).__name__} needs {self.Settings.__name__}, got {type(settings).__name__}")
        self.settings: SettingsT = settings

    @abstractmethod
    async def start(self) -> EngineFacts:
        """Start (or connect to) the engine and describe it. Called once, before serving."""

    @abstractmethod
    async def stop(self) -> None:
        """Release the engine. Called once; in-flight requests were already aborted."""

    @abstractmethod
    def generate(self, request: GenerationRequest) -> EventStream:
        """Start generating; return the ``EventStream`` that carries the request's events.

        This method is synchronous on purpose: it is the driver's half of pre-acceptance
        validation. Raise a ``RequestError`` (``InvalidArgument``, ``NotFound``...) here for a
        request the engine cannot take, and the client gets that gRPC status. The stream runs
        after acceptance, where failures are ``EngineFailure``: an engine loop ``put``s into
        an ``EventStream()`` it created here, and a driver that awaits its engine per request
        returns ``EventStream.from_iterator(its_async_generator)``. One exception: a
        ``RequestError`` raised before the first event (a driver that learns the verdict
        asynchronously, as the ``remote`` proxy does) is still that gRPC status.

        The events follow the protocol in ``spi.events``. Client cancellation, deadlines and
        ``Abort`` all reach the driver through ``abort``.
        """

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop the accepted request ``request_id`` and free what it holds; idempotent."""

    # -- optional capabilities: advertise them in EngineFacts, override them here --------

    async def embed(self, call: EmbedCall) -> tuple[Sequence[Embedding], TaskUsage]:
        """One ``Embedding`` per item, in order; the core checks them and adds ids and indexes."""
        raise Unimplemented(f"{self.name} does not implement Embed")

    async def classify(self, call: ClassifyCall) -> tuple[Sequence[Classification], TaskUsage]:
        """One ``Classification`` per item, in order; the core checks them and adds ids and indexes."""
        raise Unimplemented(f"{self.name} does not implement Classify")

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """Every group's candidates in order, with the semantics actually produced; the core adds
        ids, indexes and the label order."""
        raise Unimplemented(f"{self.name} does not implement Score")

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """Load ``adapter`` (already validated and unique) so requests can name it."""
        raise Unimplemented(f"{self.name} does not implement LoRA loading")

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """Unload ``adapter``; requests naming it are rejected from now on."""
        raise Unimplemented(f"{self.name} does not implement LoRA unloading")

    async def abort_kv_session(self, session_id: str) -> bool:
        """Release the KV session ``session_id``; False when the engine does not hold it."""
        return False

    async def abort_all_kv_sessions(self) -> int:
        """Release every KV session the engine holds (a drain past its deadline); how many."""
        return 0

    async def load(self) -> Load:
        """A point-in-time load snapshot; leave what the engine cannot measure ``None``."""
        return Load()

    async def check_health(self) -> list[HealthCheck]:
        """The engine's own health checks (``scheduler``, ``model``, ``kv_connector``...).

        The default says only that the driver is running. Raise nothing: report a failing
        check with state NOT_READY and a message.
        """
        return [HealthCheck("model", pb.HEALTH_STATE_READY, "engine started")]

    async def inference_probe(self) -> str | None:
        """Run the engine's own minimal inference for ``Health``; return what it observed.

        ``None`` (the default) lets the gateway probe through ``generate`` (one token, or a
        prefill whose session it releases), which fits an engine that takes requests without a
        KV session. Raise (an ``EngineFailure``) when the probe fails.
        """
        return None

    def kv_event_sources(self) -> list[KvEventSource]:
        """Engine-native KV event publishers clients may subscribe to directly (for example a
        ZMQ endpoint per DP rank: ``spi.zmq_kv.zmq_source``)."""
        return []

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """The engine's KV cache events as batches, per DP rank in publish order.

        Called once when ``publishes_kv_events`` is set. A ``sequence_number`` of zero asks
        the gateway to number the batch; non-zero numbers (an engine's own) are kept. Ranks
        are the engine's own and must be among those its ``parallelism`` advertises: behind
        an endpoint with several engines the gateway renumbers them (``contract.ranks``).
        An engine that publishes over ZMQ is served by ``spi.zmq_kv.subscribe``.
        """
        raise Unimplemented(f"{self.name} does not publish KV events")

    def runtime_events(self) -> AsyncIterator[pb.RuntimeEvent]:
        """Scheduler, batch, queue and transfer events; called once when advertised."""
        raise Unimplemented(f"{self.name} does not publish runtime events")


__all__ = ["SPI_VERSION", "Backend", "BackendSettings", "EngineFacts", "EventStream", "SettingsT", "SharedEngine"]
