"""Bounded outboxes for the engine's KV-event batches and runtime events.

The engine never waits for a consumer and never drops an event silently: each outbox holds
at most ``capacity`` items; when a consumer falls that far behind, the outbox stops taking
items and its iterator, after delivering what it holds, raises ``EventOverflow``, so the
gateway ends its subscriptions with an error instead of serving a stream with a hole.
Nothing is buffered before a consumer attaches.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Generic, TypeVar

from openengine_gateway import pb

T = TypeVar("T")


class EventOverflow(RuntimeError):
    """The consumer fell behind the engine by more than the outbox holds."""


class Outbox(Generic[T]):
    """A single-consumer bounded queue that fails loudly on overflow."""

    __slots__ = ("_attached", "_capacity", "_items", "_overflowed", "_waiter", "_what")

    def __init__(self, capacity: int, what: str) -> None:
        self._capacity = capacity
        self._what = what
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._attached = False
        self._overflowed = False

    @property
    def accepting(self) -> bool:
        """Whether ``put`` keeps items (a consumer is attached and has kept up)."""
        return self._attached and not self._overflowed

    def attach(self) -> Outbox[T]:
        """Become the one consumer; returns the async iterator of items."""
        if self._attached:
            raise RuntimeError(f"the {self._what} stream has a consumer already")
        self._attached = True
        return self

    def put(self, item: T) -> None:
        """Queue ``item``; past capacity, stop accepting and fail the consumer."""
        if not self.accepting:
            return
        if len(self._items) >= self._capacity:
            self._overflowed = True
        else:
            self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Outbox[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._overflowed:
                raise EventOverflow(f"the {self._what} consumer fell more than {self._capacity} items behind")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


def runtime_event(kind: pb.RuntimeEventType.ValueType, **attributes: object) -> pb.RuntimeEvent:
    """A runtime event stamped now; attribute values are stringified."""
    return pb.RuntimeEvent(
        timestamp_unix_nanos=time.time_ns(),
        type=kind,
        attributes={name: str(value) for name, value in attributes.items()},
    )


__all__ = ["EventOverflow", "Outbox", "runtime_event"]
