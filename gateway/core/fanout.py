"""A bounded subscriber queue for event streams (KV events, runtime events).

A publisher never waits for a subscriber. Each subscriber has a fixed capacity; one that
falls behind by more than that is ended with one terminal item (an ``EngineError`` response
built by ``on_overflow``) instead of silently losing events or growing without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Subscriber(Generic[T]):
    """One subscriber's queue; iterate it to receive items until it is closed."""

    __slots__ = ("_capacity", "_closed", "_items", "_on_overflow", "_preloaded", "_waiter", "overflowed")

    def __init__(self, capacity: int, on_overflow: Callable[[], T]) -> None:
        self._items: deque[T] = deque()
        self._capacity = capacity
        self._on_overflow = on_overflow
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._preloaded = 0
        """Items at the front from ``preload``, not yet taken: they do not count against the capacity."""
        self.overflowed = False

    @property
    def closed(self) -> bool:
        """True once no more items will be accepted."""
        return self._closed

    def offer(self, item: T) -> bool:
        """Queue ``item``; on overflow end the stream with the overflow item. False if closed."""
        if self._closed:
            return False
        if len(self._items) - self._preloaded >= self._capacity:
            self.overflowed = True
            self.close(self._on_overflow())
            return False
        self._items.append(item)
        self._wake()
        return True

    def preload(self, items: Iterable[T]) -> None:
        """Queue what the subscription starts with (a replay of retained items) on top of the
        queue's bound, which bounds only what arrives after it."""
        before = len(self._items)
        self._items.extend(items)
        self._preloaded += len(self._items) - before
        self._wake()

    def close(self, final: T | None = None) -> None:
        """Stop accepting; deliver ``final`` (a terminal item) after what is queued."""
        if self._closed:
            return
        if final is not None:
            self._items.append(final)
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Subscriber[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._preloaded:
            self._preloaded -= 1
        return self._items.popleft()


__all__ = ["Subscriber"]
