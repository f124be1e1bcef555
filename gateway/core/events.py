"""KV-event and runtime-event subscriptions, fed by one pump per publishing engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from .. import pb
from ..contract.kv_events import KvEventHub
from ..contract.runtime_events import RuntimeEventHub
from ..engines import EngineSet
from ..errors import EngineFailure, Unimplemented
from .background import BackgroundTasks

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
    ) -> None:
        self._engines = engines
        self._background = background
        ranks: set[int] = {0}
        for engine in engines:
            parallelism = engine.facts.parallelism
            if parallelism.HasField("data_parallel_size"):
                start = parallelism.data_parallel_start_rank if parallelism.HasField("data_parallel_start_rank") else 0
                ranks.update(range(start, start + parallelism.data_parallel_size))
        self.kv = KvEventHub(ranks, replay_batches=kv_replay_batches, subscriber_queue=subscriber_queue)
        self.runtime = RuntimeEventHub(subscriber_queue=subscriber_queue)
        self._pumps: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start pumping every engine's published events into the hubs."""
        for engine in self._engines:
            if engine.facts.publishes_kv_events:
                self._pumps.append(
                    self._background.spawn(
                        self._pump(engine.backend.kv_events(), self.kv.publish, "KV events", self.kv.close),
                        f"{engine.served_name} KV events",
                    )
                )
            if engine.facts.publishes_runtime_events:
                self._pumps.append(
                    self._background.spawn(
                        self._pump(
                            engine.backend.runtime_events(), self.runtime.publish, "runtime events", self.runtime.close
                        ),
                        f"{engine.served_name} runtime events",
                    )
                )

    @staticmethod
    async def _pump(
        source: AsyncIterator[T], publish: Callable[[T], None], what: str, close: Callable[[EngineFailure], None]
    ) -> None:
        try:
            async for item in source:
                publish(item)
        except Exception as exc:  # broad on purpose: a dead source must end its subscribers visibly
            log.exception("the engine's %s source failed", what)
            close(EngineFailure(pb.ERROR_CODE_INTERNAL, f"the engine's {what} source failed: {exc}", retryable=True))

    async def subscribe_kv(self, request: pb.SubscribeKvEventsRequest) -> AsyncIterator[pb.SubscribeKvEventsResponse]:
        """Snapshot or replay, then live batches, until the client leaves or a terminal error."""
        if not any(engine.facts.publishes_kv_events for engine in self._engines):
            raise Unimplemented("no engine behind this gateway publishes KV events")
        queue = self.kv.subscribe(
            request.data_parallel_ranks,
            include_snapshot=request.include_snapshot,
            start_sequence_number=request.start_sequence_number,
        )
        try:
            async for item in queue:
                yield item
        finally:
            self.kv.unsubscribe(queue)

    async def subscribe_runtime(
        self, request: pb.SubscribeRuntimeEventsRequest
    ) -> AsyncIterator[pb.SubscribeRuntimeEventsResponse]:
        """Live runtime events of the requested types until the client leaves."""
        if not any(engine.facts.publishes_runtime_events for engine in self._engines):
            raise Unimplemented("no engine behind this gateway publishes runtime events")
        queue = self.runtime.subscribe(request.types)
        try:
            async for item in queue:
                yield item
        finally:
            self.runtime.unsubscribe(queue)

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
