"""Shared test fakes: one scriptable ``Backend``, engine builders and async-iteration helpers.

Every unit test that needs an engine uses ``FakeBackend`` (never a private copy), so the
fake and the SPI cannot drift apart one test module at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from openengine_gateway import pb
from openengine_gateway.core.background import BackgroundTasks
from openengine_gateway.core.lora import LoraRegistry
from openengine_gateway.core.registry import RequestRegistry
from openengine_gateway.core.state import GatewayState
from openengine_gateway.engines import Engine, EngineSet
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    Classification,
    ClassifyCall,
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
    ScoreCall,
    ScoreResult,
    TaskUsage,
)

T = TypeVar("T")
GenerateHandler = Callable[[GenerationRequest], EventStream]


class FakeBackend(Backend[BackendSettings]):
    """A scriptable in-memory engine.

    ``generate`` calls ``on_generate`` (default: an ``EventStream`` the test feeds through
    ``streams``); the unary task methods call the matching ``on_*`` handler. Every call is
    recorded so tests can assert what the core passed down.
    """

    name = "fake"

    def __init__(
        self,
        settings: BackendSettings | None = None,
        *,
        model: pb.ModelInfo | None = None,
        role: int = pb.ENGINE_ROLE_AGGREGATED,
        engine_name: str = "fake",
        engine_version: str = "1.0",
        parallelism: pb.ParallelismInfo | None = None,
        kv_connector: pb.KvConnectorInfo | None = None,
        instance_id: str = "",
        supports_abort: bool = True,
        lora_adapters: Sequence[LoraAdapter] = (),
        shares_filesystem: bool = True,
        publishes_kv_events: bool = False,
        publishes_runtime_events: bool = False,
    ) -> None:
        super().__init__(settings or BackendSettings(model="fake-model"))
        self.facts = EngineFacts(
            engine_name=engine_name,
            engine_version=engine_version,
            model=model if model is not None else pb.ModelInfo(),
            role=role,  # type: ignore[arg-type]
            parallelism=parallelism if parallelism is not None else pb.ParallelismInfo(),
            kv_connector=kv_connector,
            instance_id=instance_id,
            lora_adapters=lora_adapters,
            shares_filesystem=shares_filesystem,
            publishes_kv_events=publishes_kv_events,
            publishes_runtime_events=publishes_runtime_events,
            supports_abort=supports_abort,
        )
        self.on_generate: GenerateHandler | None = None
        self.on_embed: Callable[[EmbedCall], Awaitable[tuple[list[Embedding], TaskUsage]]] | None = None
        self.on_classify: Callable[[ClassifyCall], Awaitable[tuple[list[Classification], TaskUsage]]] | None = None
        self.on_score: Callable[[ScoreCall], Awaitable[tuple[ScoreResult, TaskUsage]]] | None = None
        self.requests: list[GenerationRequest] = []
        self.streams: dict[str, EventStream] = {}
        self.aborted: list[str] = []
        self.abort_called = asyncio.Event()
        self.kv_sessions: set[str] = set()
        self.released_sessions: list[str] = []
        self.loaded_loras: list[LoraAdapter] = []
        self.unloaded_loras: list[LoraAdapter] = []
        self.load_info = Load()
        self.load_error: BaseException | None = None
        self.report_kv_sessions = False
        """When set, ``load`` reports ``active_kv_sessions`` as the sessions held right now."""
        self.health_checks = [HealthCheck("model", pb.HEALTH_STATE_READY, "ok")]
        self.event_sources: list[KvEventSource] = []
        self.kv_queue: asyncio.Queue[KvEventBatch | BaseException | None] = asyncio.Queue()
        self.runtime_queue: asyncio.Queue[pb.RuntimeEvent | BaseException | None] = asyncio.Queue()
        self.started = False
        self.stopped = False

    async def start(self) -> EngineFacts:
        self.started = True
        return self.facts

    async def stop(self) -> None:
        self.stopped = True

    def generate(self, request: GenerationRequest) -> EventStream:
        self.requests.append(request)
        if self.on_generate is not None:
            return self.on_generate(request)
        stream = EventStream()
        self.streams[request.request_id] = stream
        return stream

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.abort_called.set()

    async def embed(self, call: EmbedCall) -> tuple[Sequence[Embedding], TaskUsage]:
        if self.on_embed is None:
            return await super().embed(call)
        return await self.on_embed(call)

    async def classify(self, call: ClassifyCall) -> tuple[Sequence[Classification], TaskUsage]:
        if self.on_classify is None:
            return await super().classify(call)
        return await self.on_classify(call)

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        if self.on_score is None:
            return await super().score(call)
        return await self.on_score(call)

    async def load_lora(self, adapter: LoraAdapter) -> None:
        self.loaded_loras.append(adapter)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        self.unloaded_loras.append(adapter)

    async def abort_kv_session(self, session_id: str) -> bool:
        if session_id in self.kv_sessions:
            self.kv_sessions.discard(session_id)
            self.released_sessions.append(session_id)
            return True
        return False

    async def abort_all_kv_sessions(self) -> int:
        count = len(self.kv_sessions)
        self.released_sessions.extend(sorted(self.kv_sessions))
        self.kv_sessions.clear()
        return count

    async def load(self) -> Load:
        if self.load_error is not None:
            raise self.load_error
        if not self.report_kv_sessions:
            return self.load_info
        return dataclasses.replace(self.load_info, active_kv_sessions=len(self.kv_sessions))

    async def check_health(self) -> list[HealthCheck]:
        return list(self.health_checks)

    def kv_event_sources(self) -> list[KvEventSource]:
        return list(self.event_sources)

    async def kv_events(self) -> AsyncIterator[KvEventBatch]:  # type: ignore[override]
        while (item := await self.kv_queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def runtime_events(self) -> AsyncIterator[pb.RuntimeEvent]:  # type: ignore[override]
        while (item := await self.runtime_queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item


def scripted(*events: GenerationEvent, error: BaseException | None = None) -> GenerateHandler:
    """An ``on_generate`` handler whose async generator yields ``events`` (then raises ``error``)."""

    def handler(_request: GenerationRequest) -> EventStream:
        async def run() -> AsyncIterator[GenerationEvent]:
            for event in events:
                yield event
            if error is not None:
                raise error

        return EventStream.from_iterator(run())

    return handler


def engine(backend: FakeBackend, name: str = "m", aliases: Iterable[str] = ()) -> Engine:
    """An ``Engine`` for a fake backend (its facts are available without awaiting ``start``)."""
    return Engine(name, tuple(aliases), backend, backend.facts)


def engine_set(*backends: FakeBackend | tuple[FakeBackend, str] | tuple[FakeBackend, str, Iterable[str]]) -> EngineSet:
    """An ``EngineSet`` of fake engines; a bare backend is served as ``m``."""
    engines = []
    for entry in backends:
        if isinstance(entry, FakeBackend):
            engines.append(engine(entry))
        else:
            engines.append(engine(*entry))
    return EngineSet(engines)


class CoreParts:
    """The shared pieces a core service is built from, fresh per test."""

    def __init__(self, *, max_in_flight: int | None = None, finished_window: int = 64) -> None:
        self.registry = RequestRegistry(finished_window=finished_window, max_in_flight=max_in_flight)
        self.state = GatewayState()
        self.state.started = True
        self.loras = LoraRegistry()
        self.background = BackgroundTasks()


async def collect(iterator: AsyncIterator[Any]) -> list[Any]:
    """Every item of an async iterator."""
    return [item async for item in iterator]


async def ready(iterator: AsyncIterator[T], limit: int | None = None) -> list[T]:
    """Up to ``limit`` items the iterator yields right now, without waiting for its producer.

    Each read gets one loop turn: a mailbox with an item returns it within that turn; one
    that would have to wait is cancelled, and the items read so far are returned. An
    iterator that ends also ends the list.
    """
    items: list[T] = []
    while limit is None or len(items) < limit:
        read = asyncio.ensure_future(_next(iterator))
        await asyncio.sleep(0)
        if not read.done():
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await read
            break
        more, item = read.result()
        if not more:
            break
        items.append(item)  # type: ignore[arg-type]
    return items


async def eventually(condition: Callable[[], bool], within_s: float = 2.0) -> None:
    """Wait until ``condition`` holds: state another task or process updates (a subscription opening)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def _next(iterator: AsyncIterator[T]) -> tuple[bool, T | None]:
    try:
        return True, await iterator.__anext__()
    except StopAsyncIteration:
        return False, None


__all__ = [
    "CoreParts",
    "FakeBackend",
    "collect",
    "engine",
    "engine_set",
    "eventually",
    "ready",
    "scripted",
]
