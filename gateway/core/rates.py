"""Per-caller rate limits: a token bucket for each caller, for work that is cheap to ask for and
costly to do (an inference probe runs a real request on the engine)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from ..errors import ResourceExhausted
from .callers import Caller, caller_key

_MAX_CALLERS = 65536
"""Buckets kept at most, the least recently used dropped first (a dropped bucket starts full again)."""


class RateLimit:
    """At most ``per_s`` of ``what`` per caller per second, in bursts of up to ``burst``."""

    def __init__(self, what: str, flag: str, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._what = what
        self._flag = flag
        self._per_s = per_s
        self._burst = burst
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Caller key -> (tokens left, when last filled)."""

    def take(self, caller: Caller) -> None:
        """Spend one of the caller's tokens, or refuse with RESOURCE_EXHAUSTED and the wait until its next."""
        key = caller_key(caller)
        now = self._clock()
        tokens, filled = self._buckets.pop(key, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - filled) * self._per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            wait_ms = math.ceil((1.0 - tokens) / self._per_s * 1000)
            raise ResourceExhausted(
                f"at most {self._per_s:g} {self._what} per second per caller ({self._flag}); retry in {wait_ms} ms",
                retry_after_ms=wait_ms,
            )
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > _MAX_CALLERS:
            self._buckets.popitem(last=False)


__all__ = ["RateLimit"]
