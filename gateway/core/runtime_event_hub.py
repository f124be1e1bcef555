"""Runtime events: fan-out with a type filter and bounded subscriber queues.

Runtime events are live observations (forward passes, batches, queue changes, transfers);
there is no replay. A subscriber that falls behind ends with one terminal retryable
``ERROR_CODE_OVERLOADED`` error, never silent loss.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

from .. import pb
from ..errors import EngineFailure, InvalidArgument
from .fanout import Subscriber

_KNOWN_TYPES = frozenset(v for v in pb.RuntimeEventType.values() if v != pb.RUNTIME_EVENT_TYPE_UNSPECIFIED)


class RuntimeEventHub:
    """Delivers each published runtime event to the subscribers whose filter matches."""

    def __init__(self, *, subscriber_queue: int = 1024) -> None:
        self._subscriber_queue = subscriber_queue
        self._subscriptions: dict[Subscriber[pb.SubscribeRuntimeEventsResponse], frozenset[int] | None] = {}
        self._ids = itertools.count(1)
        self.dropped_subscribers = 0
        """Subscriptions ended for falling behind."""

    @property
    def subscriber_count(self) -> int:
        """Subscriptions currently open."""
        return len(self._subscriptions)

    def publish(self, event: pb.RuntimeEvent) -> None:
        """Stamp (id, time) what the engine left empty and deliver to matching subscribers."""
        if not event.event_id:
            event.event_id = str(next(self._ids))
        if not event.timestamp_unix_nanos:
            event.timestamp_unix_nanos = time.time_ns()
        response = pb.SubscribeRuntimeEventsResponse(runtime_event=event)
        for queue, types in list(self._subscriptions.items()):
            if types is not None and event.type not in types:
                continue
            if not queue.offer(response) and queue.closed:
                del self._subscriptions[queue]
                self.dropped_subscribers += queue.overflowed

    def subscribe(self, types: Iterable[int]) -> Subscriber[pb.SubscribeRuntimeEventsResponse]:
        """Open a subscription for ``types`` (empty = all); unknown types are rejected."""
        wanted = frozenset(types)
        unknown = sorted(wanted - _KNOWN_TYPES)
        if unknown:
            raise InvalidArgument(f"unknown or unspecified runtime event types {unknown}")
        queue: Subscriber[pb.SubscribeRuntimeEventsResponse] = Subscriber(self._subscriber_queue, _overflow)
        self._subscriptions[queue] = wanted or None
        return queue

    def unsubscribe(self, queue: Subscriber[pb.SubscribeRuntimeEventsResponse]) -> None:
        """Forget a subscription whose client went away."""
        self._subscriptions.pop(queue, None)

    def close(self, failure: EngineFailure) -> None:
        """End every subscription with ``failure``."""
        for queue in self._subscriptions:
            queue.close(pb.SubscribeRuntimeEventsResponse(error=failure.to_proto()))
        self._subscriptions.clear()


def _overflow() -> pb.SubscribeRuntimeEventsResponse:
    failure = EngineFailure(
        pb.ERROR_CODE_OVERLOADED,
        "subscriber fell behind the runtime event stream",
        retryable=True,
        retry_after_ms=0,
    )
    return pb.SubscribeRuntimeEventsResponse(error=failure.to_proto())


__all__ = ["RuntimeEventHub"]
