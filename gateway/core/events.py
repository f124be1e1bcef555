"""KV-event and runtime-event subscriptions, fed by one pump per publishing engine.

Events are attributed to their engine on the way in: a KV batch's ``data_parallel_rank``
becomes the endpoint's rank (``contract.ranks``), and a runtime event gets the attribute
``model`` (the engine's served model name), so one stream can carry several engines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Literal, TypeVar

from .. import pb
from ..contract.kv_wire import kv_batch_to_proto
from ..engines import Engine, EngineSet
from ..errors import EngineFailure, ResourceExhausted, Unavailable, Unimplemented
from ..spi.kv_events import KvEventBatch
from .background import BackgroundTasks
from .kv_event_hub import KvEventHub
from .memory import MemoryBudget
from .runtime_event_hub import RuntimeEventHub

log = logging.getLogger(__name__)
T = TypeVar("T")


class EventService:
    """Owns the KV and runtime event hubs and the tasks that feed them."""

    def __init__(
        self,
        engines: EngineSet,
        background: BackgroundTasks,
        *,
        kv_replay_batches: int = 4096,
        subscriber_queue: int = 1024,
        max_subscriptions: int | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self._engines = engines
        self._memory = memory or MemoryBudget(None)
        self._background = background
        self._max_subscriptions = max_subscriptions
        self._open = 0
        ranks = sorted({rank for engine in engines for rank in engine.ranks.ranks})
        self.kv = KvEventHub(ranks, replay_batches=kv_replay_batches, subscriber_queue=subscriber_queue)
        self.runtime = RuntimeEventHub(subscriber_queue=subscriber_queue)
        self._pumps: list[asyncio.Task[None]] = []
        self._stopped: dict[str, EngineFailure] = {}
        """``kv`` / ``runtime`` → why an engine's source of that stream stopped: its hub's
        subscribers were ended, and new ones are refused rather than left waiting forever."""

    @property
    def open_subscriptions(self) -> int:
        """KV and runtime subscription streams open, each until its client leaves: one its hub ended
        (a subscriber that fell behind) still holds its buffered events until they are read."""
        return self._open

    def start(self) -> None:
        """Start pumping every engine's published events into the hubs."""
        for engine in self._engines:
            if engine.facts.publishes_kv_events:
                what = f"{engine.served_name} KV events"
                pump = self._pump(engine.backend.kv_events(), self._kv_publisher(engine), what, "kv")
                self._pumps.append(self._background.spawn(pump, what))
            if engine.facts.publishes_runtime_events:
                what = f"{engine.served_name} runtime events"
                pump = self._pump(engine.backend.runtime_events(), self._runtime_publisher(engine), what, "runtime")
                self._pumps.append(self._background.spawn(pump, what))

    def _kv_publisher(self, engine: Engine) -> Callable[[KvEventBatch], None]:
        """Publish an engine's batch, as a message, under the endpoint's rank for it."""
        span = engine.ranks

        def publish(batch: KvEventBatch) -> None:
            self.kv.publish(kv_batch_to_proto(batch, span.to_endpoint(batch.data_parallel_rank)))

        return publish

    def _runtime_publisher(self, engine: Engine) -> Callable[[pb.RuntimeEvent], None]:
        """Publish an engine's runtime event with the engine's served name as ``model``."""
        name = engine.served_name

        def publish(event: pb.RuntimeEvent) -> None:
            event.attributes["model"] = name
            self.runtime.publish(event)

        return publish

    async def _pump(
        self, source: AsyncIterator[T], publish: Callable[[T], None], what: str, stream: Literal["kv", "runtime"]
    ) -> None:
        try:
            async for item in source:
                publish(item)
            log.error("the %s source ended", what)
            failure = EngineFailure(pb.ERROR_CODE_INTERNAL, f"the {what} source ended", retryable=False)
        except Exception as exc:  # broad on purpose: a dead source must end its subscribers visibly
            log.exception("the %s source failed", what)
            failure = EngineFailure(pb.ERROR_CODE_INTERNAL, f"the {what} source failed: {exc}", retryable=False)
        self._stopped[stream] = failure
        (self.kv if stream == "kv" else self.runtime).close(failure)

    def _check_source(self, stream: Literal["kv", "runtime"]) -> None:
        """UNAVAILABLE once an engine's source of ``stream`` has stopped: nothing would ever arrive
        (so the error that ended its subscribers is not retryable: only a restart brings it back)."""
        failure = self._stopped.get(stream)
        if failure is not None:
            raise Unavailable(f"{failure.message}; restart the gateway to subscribe again")

    async def subscribe_kv(self, request: pb.SubscribeKvEventsRequest) -> AsyncIterator[pb.SubscribeKvEventsResponse]:
        """Snapshot or replay, then live batches, until the client leaves or a terminal error."""
        if not any(engine.facts.publishes_kv_events for engine in self._engines):
            raise Unimplemented("no engine behind this gateway publishes KV events")
        self._check_source("kv")
        self._check_capacity()
        queue = self.kv.subscribe(
            request.data_parallel_ranks,
            include_snapshot=request.include_snapshot,
            start_sequence_number=request.start_sequence_number,
        )
        self._open += 1
        try:
            async for item in queue:
                yield item
        finally:
            self._open -= 1
            self.kv.unsubscribe(queue)

    async def subscribe_runtime(
        self, request: pb.SubscribeRuntimeEventsRequest
    ) -> AsyncIterator[pb.SubscribeRuntimeEventsResponse]:
        """Live runtime events of the requested types until the client leaves."""
        if not any(engine.facts.publishes_runtime_events for engine in self._engines):
            raise Unimplemented("no engine behind this gateway publishes runtime events")
        self._check_source("runtime")
        self._check_capacity()
        queue = self.runtime.subscribe(request.types)
        self._open += 1
        try:
            async for item in queue:
                yield item
        finally:
            self._open -= 1
            self.runtime.unsubscribe(queue)

    def _check_capacity(self) -> None:
        """RESOURCE_EXHAUSTED (retryable) when KV and runtime subscriptions together are at the limit, or the
        process's memory is past its budget's threshold."""
        limit = self._max_subscriptions
        if limit is not None and self._open >= limit:
            raise ResourceExhausted(f"the gateway is at its limit of {limit} event subscriptions", retry_after_ms=1000)
        self._memory.check("event subscription")

    def close(self, reason: str) -> None:
        """End every subscription with a retryable error and stop the pumps (shutdown).

        A pump only ends when its engine's source does, which a running engine's never does;
        cancelling here keeps shutdown from waiting out its background grace period on them.
        """
        for pump in self._pumps:
            pump.cancel()
        failure = EngineFailure(pb.ERROR_CODE_DRAINING, reason, retryable=True, retry_after_ms=1000)
        self.kv.close(failure)
        self.runtime.close(failure)


__all__ = ["EventService"]
