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

E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
"""Seconds from acceptance to the end of a request."""
QUEUE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Seconds from a request's arrival in the core to its engine's stream being opened: the gateway's own
validation, routing and admission (the gateway holds no queue: past ``max_in_flight`` it refuses)."""

OUTCOMES = ("finished", "failed", "aborted", "cancelled")
"""How a request ended: completed; ended by an engine error; stopped by Abort or a drain;
left by its client (cancellation or deadline)."""
REJECTED = "rejected"
"""Per engine only: refused by the engine's driver before acceptance (its gRPC status is the code)."""
OK = "OK"
"""The code of a finished request."""


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

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations (the same bounds)."""
        for index, count in enumerate(list(other.counts)):
            self.counts[index] += count
        self.total += other.total

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


class EngineStats:
    """The requests one engine answered through one split (or by its own name): what the
    ``openengine_gateway_engine_*`` families report, and what a canary judges."""

    __slots__ = ("completion_tokens", "e2e", "itl", "prompt_tokens", "queued", "requests", "ttft")

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queued = Histogram(QUEUE_BUCKETS)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.requests: dict[tuple[str, str, str], int] = {}
        """(kind, outcome, code) -> requests; ``code`` is the ``EngineError`` code of a failed stream, the
        gRPC status of a refused or failed call, ``OK`` for a finished one, ``ABORTED`` or ``CANCELLED``."""

    def ended(self, kind: str, outcome: str, code: str) -> None:
        """Count one request of ``kind`` that ended with ``outcome`` and ``code``."""
        key = (kind, outcome, code)
        self.requests[key] = self.requests.get(key, 0) + 1


class Telemetry:
    """The gateway's request measurements, per (engine, split); one instance per gateway.

    The gateway-wide figures are the sums over engines, added up at scrape time, so a token is
    observed once, into its engine's histogram. The keys are served names from the configuration
    (an engine's, a split's), never a client's text, so their number is bounded by the
    configurations served."""

    def __init__(self) -> None:
        self.engines: dict[tuple[str, str], EngineStats] = {}
        """(engine served name, split name or "") -> its requests' statistics, from its first request on."""

    def stats(self, engine: str, split: str) -> EngineStats:
        """The statistics of ``engine``'s requests through ``split`` ("" when addressed by its own name)."""
        stats = self.engines.get((engine, split))
        if stats is None:
            stats = self.engines[engine, split] = EngineStats()
        return stats

    def merged(self, name: str) -> Histogram:
        """One histogram of ``EngineStats`` (``ttft``, ``itl``, ``e2e``, ``queued``) summed over every engine."""
        merged = Histogram(getattr(EngineStats(), name).bounds)
        for histogram in [getattr(stats, name) for stats in list(self.engines.values())]:
            merged.add(histogram)
        return merged

    @property
    def prompt_tokens(self) -> int:
        return sum(stats.prompt_tokens for stats in list(self.engines.values()))

    @property
    def completion_tokens(self) -> int:
        return sum(stats.completion_tokens for stats in list(self.engines.values()))

    @property
    def outcomes(self) -> dict[tuple[str, str], int]:
        """(kind, outcome) -> accepted requests, over every engine (every pair present, 0 or more)."""
        totals = {(kind, outcome): 0 for kind in ("generate", "task") for outcome in OUTCOMES}
        for stats in list(self.engines.values()):
            for (kind, outcome, _code), count in list(stats.requests.items()):
                if outcome != REJECTED:
                    totals[kind, outcome] += count
        return totals


class StreamClock:
    """Time queued, to first token, between token messages and to the end of one stream."""

    __slots__ = ("_last", "_start", "_stats")

    def __init__(self, stats: EngineStats, arrived: float) -> None:
        """Started now, for a stream accepted now; ``arrived``: ``perf_counter`` when it reached the core."""
        self._stats = stats
        self._start = time.perf_counter()
        self._last = 0.0
        stats.queued.observe(self._start - arrived)

    def token(self) -> None:
        """A token message is being sent now."""
        now = time.perf_counter()
        if self._last:
            self._stats.itl.observe(now - self._last)
        else:
            self._stats.ttft.observe(now - self._start)
        self._last = now

    def ended(self) -> None:
        """The stream is over: its end-to-end latency."""
        self._stats.e2e.observe(time.perf_counter() - self._start)


__all__ = [
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "OK",
    "OUTCOMES",
    "QUEUE_BUCKETS",
    "REJECTED",
    "TTFT_BUCKETS",
    "EngineStats",
    "Histogram",
    "StreamClock",
    "Telemetry",
    "outcome",
]
