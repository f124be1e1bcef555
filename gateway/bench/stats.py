"""Latency and throughput statistics per target, and token agreement between targets.

Two per-token latencies are reported because they answer different questions. ITL (inter-token
latency) is the gap between successive token messages, one sample per gap, as vLLM's benchmark
measures it: it is what a streaming client waits between updates, so an engine that coalesces
several tokens into one message shows fewer, longer gaps. TPOT (time per output token) is
``(e2e - TTFT) / (output tokens - 1)`` per request: the decode speed, unchanged by coalescing.
Latencies are over finished requests only; errors are counted by code. ``BucketCounts`` gives the
same figures for a Prometheus histogram scraped from a running gateway (``bench --live``).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import RequestRecord, TargetRun

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of a sample (all ``None`` when it is empty)."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """The distribution of ``values`` (percentiles interpolated linearly, as numpy does)."""
        if not values:
            return cls(0, None, None, None, None)
        array = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = (float(p) for p in np.percentile(array, PERCENTILES))
        return cls(len(values), float(array.mean()), p50, p90, p99)


@dataclass(frozen=True)
class BucketCounts:
    """A Prometheus histogram: cumulative counts by upper bound (ascending, the last one +Inf) and the
    sum of observations."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float

    @property
    def count(self) -> int:
        """Observations in all."""
        return int(self.cumulative[-1]) if self.cumulative else 0

    def minus(self, earlier: BucketCounts) -> BucketCounts:
        """The observations made since ``earlier``, a scrape of the same histogram."""
        if earlier.bounds != self.bounds:
            raise ValueError(f"histogram buckets changed from {earlier.bounds} to {self.bounds}")
        counts = tuple(now - then for now, then in zip(self.cumulative, earlier.cumulative, strict=True))
        return BucketCounts(self.bounds, counts, self.total - earlier.total)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q < 1) interpolated linearly within its bucket, as Prometheus'
        ``histogram_quantile`` does: from 0 in the first bucket (unless its bound is not above 0), and
        the highest finite bound when the rank falls in the +Inf bucket. ``None`` without observations."""
        if self.count <= 0:
            return None
        rank = q * self.cumulative[-1]
        index = bisect_left(self.cumulative, rank)
        if index >= len(self.bounds) - 1:
            return self.bounds[-2] if len(self.bounds) > 1 else None
        end = self.bounds[index]
        if index == 0:
            if end <= 0:
                return end
            start, below = 0.0, 0.0
        else:
            start, below = self.bounds[index - 1], self.cumulative[index - 1]
        return start + (end - start) * (rank - below) / (self.cumulative[index] - below)

    def distribution(self) -> Distribution:
        """Mean (exact, from the sum) and interpolated percentiles, as ``Distribution.of`` gives for samples."""
        if self.count <= 0:
            return Distribution(0, None, None, None, None)
        p50, p90, p99 = (self.quantile(p / 100) for p in PERCENTILES)
        return Distribution(self.count, self.total / self.cumulative[-1], p50, p90, p99)


def ttft(record: RequestRecord) -> float | None:
    """Seconds from sending to the first token message (``None`` when no token came)."""
    return record.message_times[0] - record.started if record.message_times else None


def e2e(record: RequestRecord) -> float:
    """Seconds from sending to the end of the stream."""
    return record.ended - record.started


def tpot(record: RequestRecord) -> float | None:
    """Seconds per output token after the first (``None`` under two tokens)."""
    first = ttft(record)
    if first is None or record.output_tokens < 2:
        return None
    return (e2e(record) - first) / (record.output_tokens - 1)


def inter_token_gaps(record: RequestRecord) -> list[float]:
    """Seconds between successive token messages."""
    return [later - earlier for earlier, later in itertools.pairwise(record.message_times)]


@dataclass(frozen=True)
class Samples:
    """Per-request (and, for ITL, per-gap) latency samples of the finished requests of a run."""

    ttft: list[float]
    itl: list[float]
    tpot: list[float]
    e2e: list[float]
    tokens_per_message: list[float]

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> Samples:
        """The samples of ``records``' finished requests."""
        finished = [r for r in records if r.ok]
        return cls(
            ttft=[t for t in map(ttft, finished) if t is not None],
            itl=[gap for r in finished for gap in inter_token_gaps(r)],
            tpot=[t for t in map(tpot, finished) if t is not None],
            e2e=[e2e(r) for r in finished],
            tokens_per_message=[float(n) for r in finished for n in r.message_tokens],
        )


@dataclass(frozen=True)
class TargetSummary:
    """One target's figures: counts, throughput and latency distributions (seconds)."""

    target: str
    engine: str
    requests: int
    completed: int
    failed: int
    errors: dict[str, int]
    error_examples: dict[str, str]
    """The server's message with the first request failed under each code."""
    duration_s: float
    requests_per_s: float
    output_tokens: int
    usage_completion_tokens: int
    output_tokens_per_s: float
    prompt_tokens: int
    cached_prompt_tokens: int | None
    messages: int
    ttft_s: Distribution
    itl_s: Distribution
    tpot_s: Distribution
    e2e_s: Distribution
    tokens_per_message: Distribution
    interrupted: bool = False
    """Stopped early (Ctrl-C): the figures cover the requests that had ended by then."""


def _first_messages(records: Sequence[RequestRecord]) -> dict[str, str]:
    """The message of the first request to fail under each error code, so failures can be read."""
    examples: dict[str, str] = {}
    for record in records:
        if record.error is not None:
            examples.setdefault(record.error, record.error_message)
    return examples


def summarize(run: TargetRun) -> TargetSummary:
    """The summary of one target's measured phase; throughput counts finished requests."""
    finished = [r for r in run.records if r.ok]
    samples = Samples.of(run.records)
    output_tokens = sum(r.output_tokens for r in finished)
    cached = [r.cached_prompt_tokens for r in finished if r.cached_prompt_tokens is not None]
    rate = 1.0 / run.duration_s if run.duration_s > 0 else 0.0
    return TargetSummary(
        target=run.target.label,
        engine=run.engine,
        requests=len(run.records),
        completed=len(finished),
        failed=len(run.records) - len(finished),
        errors=dict(Counter(r.error for r in run.records if r.error is not None).most_common()),
        error_examples=_first_messages(run.records),
        duration_s=run.duration_s,
        requests_per_s=len(finished) * rate,
        output_tokens=output_tokens,
        usage_completion_tokens=sum(r.completion_tokens for r in finished),
        output_tokens_per_s=output_tokens * rate,
        prompt_tokens=sum(r.prompt_tokens for r in finished),
        cached_prompt_tokens=sum(cached) if cached else None,
        messages=sum(len(r.message_times) for r in finished),
        ttft_s=Distribution.of(samples.ttft),
        itl_s=Distribution.of(samples.itl),
        tpot_s=Distribution.of(samples.tpot),
        e2e_s=Distribution.of(samples.e2e),
        tokens_per_message=Distribution.of(samples.tokens_per_message),
        interrupted=run.interrupted,
    )


@dataclass(frozen=True)
class Agreement:
    """How often a target's outputs equal the baseline's, token for token, over requests both finished."""

    baseline: str
    target: str
    compared: int
    identical: float | None
    """Fraction of compared requests with identical token ids."""
    common_prefix: float | None
    """Mean of common-prefix length / longer output length."""


def common_prefix_fraction(first: Sequence[int], second: Sequence[int]) -> float:
    """The common prefix's share of the longer sequence (1 for two empty ones)."""
    longer = max(len(first), len(second))
    if not longer:
        return 1.0
    shorter = min(len(first), len(second))
    common = next((i for i in range(shorter) if first[i] != second[i]), shorter)
    return common / longer


def agreement(baseline: TargetRun, other: TargetRun) -> Agreement:
    """Token agreement of ``other`` with ``baseline``, request index by request index."""
    theirs = {r.index: r.token_ids for r in other.records if r.ok}
    pairs = [(r.token_ids, theirs[r.index]) for r in baseline.records if r.ok and r.index in theirs]
    label, target = baseline.target.label, other.target.label
    if not pairs:
        return Agreement(label, target, 0, None, None)
    identical = sum(a == b for a, b in pairs) / len(pairs)
    prefix = sum(common_prefix_fraction(a, b) for a, b in pairs) / len(pairs)
    return Agreement(label, target, len(pairs), identical, prefix)


@dataclass(frozen=True)
class Comparison:
    """Every target's summary, and each later target's agreement with the first."""

    summaries: tuple[TargetSummary, ...]
    agreements: tuple[Agreement, ...]


def compare(runs: Sequence[TargetRun], *, greedy: bool) -> Comparison:
    """Summaries of ``runs``; agreement only for greedy decoding, where outputs should be equal."""
    agreements = tuple(agreement(runs[0], run) for run in runs[1:]) if greedy else ()
    return Comparison(tuple(summarize(run) for run in runs), agreements)


def throughput_over_time(
    records: Sequence[RequestRecord], duration_s: float, bins: int = 40
) -> list[tuple[float, float]]:
    """Output tokens/s received in ``bins`` equal windows of the run, as (window middle, rate)."""
    if duration_s <= 0:
        return []
    width = duration_s / bins
    counts = [0] * bins
    for record in records:
        for at, tokens in zip(record.message_times, record.message_tokens, strict=True):
            counts[min(int(at / width), bins - 1)] += tokens
    return [((i + 0.5) * width, count / width) for i, count in enumerate(counts)]


__all__ = [
    "PERCENTILES",
    "Agreement",
    "BucketCounts",
    "Comparison",
    "Distribution",
    "Samples",
    "TargetSummary",
    "agreement",
    "common_prefix_fraction",
    "compare",
    "e2e",
    "inter_token_gaps",
    "summarize",
    "throughput_over_time",
    "tpot",
    "ttft",
]
