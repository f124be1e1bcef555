"""What the core measures about requests: latency histograms, token counts, outcomes.

The core writes these from the event loop on the streaming path, so they are plain ints and
floats with no locks and no per-observation allocation; the metrics exporter
(``server.metrics``) reads them from its scrape thread. A scrape may see a histogram one
observation ahead in a bucket and behind in its sum, which Prometheus tolerates.
Observations are per streamed message, not per token: when a lagging client gets several
tokens coalesced into one message, the inter-token latency is that message's gap.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
"""Seconds from acceptance to the first token message."""
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds between consecutive token messages of one request."""

OUTCOMES = ("finished", "failed", "aborted", "cancelled")
"""How a request ended: completed; ended by an engine error; stopped by Abort or a drain;
left by its client (cancellation or deadline)."""


class Histogram:
    """Counts per bucket (``le`` bounds, the last one +Inf) and the sum of observations."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` pairs, ending with ``(inf, count)``."""
        result = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += count
            result.append((bound, running))
        return result


def outcome(*, finished: bool, failed: bool, aborted: bool) -> str:
    """The ``OUTCOMES`` entry for a request that ended this way (otherwise its client left)."""
    return "finished" if finished else "failed" if failed else "aborted" if aborted else "cancelled"


class Telemetry:
    """The gateway's request measurements, one instance per gateway."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.outcomes: dict[tuple[str, str], int] = {
            (kind, outcome): 0 for kind in ("generate", "task") for outcome in OUTCOMES
        }

    def clock(self) -> StreamClock:
        """A clock for one accepted Generate stream, started now."""
        return StreamClock(self)

    def ended(self, kind: str, outcome: str) -> None:
        """Count one request of ``kind`` (generate, task) that ended with ``outcome``."""
        self.outcomes[kind, outcome] += 1

    def usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Add one request's final token counts."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens


class StreamClock:
    """Time to first token and gaps between token messages of one stream."""

    __slots__ = ("_last", "_start", "_telemetry")

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._start = time.perf_counter()
        self._last = 0.0

    def token(self) -> None:
        """A token message is being sent now."""
        now = time.perf_counter()
        if self._last:
            self._telemetry.itl.observe(now - self._last)
        else:
            self._telemetry.ttft.observe(now - self._start)
        self._last = now


__all__ = ["ITL_BUCKETS", "OUTCOMES", "TTFT_BUCKETS", "Histogram", "StreamClock", "Telemetry", "outcome"]
