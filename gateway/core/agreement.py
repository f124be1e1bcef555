"""How a mirrored engine agrees with the engine it shadows: per (primary, shadow) pair, counts of
copies, identical and diverged outputs, where they diverge, finish reasons, errors and latency.

The mirror (``core.mirror``) hands over one ``Side`` per engine when a copied request ends. Output
agreement is counted only for greedy requests, the only ones where two engines should produce the
same output; it compares token ids when both engines share a tokenizer and characters of text when
they do not, and a pair whose shorter output is a prefix of the longer diverges at the shorter
length. Like ``core.telemetry`` these are plain ints, floats and histograms written on the event
loop without locks and read by the metrics exporter's scrape thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest

from .telemetry import ITL_BUCKETS, TTFT_BUCKETS, Histogram

DIVERGENCE_BUCKETS = (0.0, *(float(2**power) for power in range(15)))
"""First differing position of a diverged output: a token index, or a character index (``BASES``)."""
BASES = ("tokens", "text")
"""What a divergence position counts: token ids (the engines share a tokenizer) or characters of text."""
SIDES = ("primary", "shadow")
COPY_OUTCOMES = ("compared", "shed", "skipped", "cancelled")
"""What became of a copy: both streams ended and were compared; not made because the mirror was
full; not made because the shadow would refuse the request; aborted with its primary (Abort,
client cancel, primary failure)."""
UNFINISHED = "UNFINISHED"
"""The finish reason recorded for an output that ended without one."""


@dataclass(slots=True)
class Side:
    """What one side (the primary or the shadow) of a mirrored request produced."""

    engine: str
    """The engine's served name."""
    token_ids: list[list[int]]
    """Per output_index, in order."""
    text: list[str]
    """Per output_index."""
    finish_reasons: list[str]
    """Per output_index: the FinishReason name without its prefix ("STOP", "LENGTH", ...), "" when unfinished."""
    ttft_s: float | None
    """From the request's start to its first token, None when no token came."""
    itl_s: list[float]
    """Gaps between consecutive token events."""
    error: str = ""
    """The ErrorCode name when the stream ended with an engine error, else ""."""


@dataclass(slots=True)
class PairStats:
    """The statistics of one (primary, shadow) pair."""

    copies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COPY_OUTCOMES, 0))
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """(side, ErrorCode name) -> streams that ended with that engine error."""
    identical: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BASES, 0))
    """Greedy outputs equal on both sides, by basis."""
    diverged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BASES, 0))
    divergence: dict[str, Histogram] = field(
        default_factory=lambda: {basis: Histogram(DIVERGENCE_BUCKETS) for basis in BASES}
    )
    """First differing position of each diverged greedy output, by basis."""
    finish_reasons: dict[tuple[str, str], int] = field(default_factory=dict)
    """(primary reason, shadow reason) -> outputs; ``UNFINISHED`` for an output without one."""
    ttft: dict[str, Histogram] = field(default_factory=lambda: {side: Histogram(TTFT_BUCKETS) for side in SIDES})
    itl: dict[str, Histogram] = field(default_factory=lambda: {side: Histogram(ITL_BUCKETS) for side in SIDES})


def first_difference(first: Sequence[object], second: Sequence[object]) -> int | None:
    """The first position where the sequences differ (the shorter length when one is a strict prefix
    of the other), or ``None`` when they are equal."""
    if first == second:
        return None
    for position, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return position
    return min(len(first), len(second))


class Agreement:
    """Every mirrored pair's statistics; one per gateway (``Gateway.agreement``)."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], PairStats] = {}
        """(primary engine, shadow engine) -> its statistics, from the pair's first copy on."""

    def _pair(self, primary: str, shadow: str) -> PairStats:
        stats = self.pairs.get((primary, shadow))
        if stats is None:
            stats = self.pairs[primary, shadow] = PairStats()
        return stats

    def compared(self, primary: Side, shadow: Side, *, greedy: bool, same_tokenizer: bool) -> None:
        """Count one copy whose two streams both ended: latency, finish reasons and errors always;
        output agreement for a greedy request that neither engine failed."""
        stats = self._pair(primary.engine, shadow.engine)
        stats.copies["compared"] += 1
        for side, record in zip(SIDES, (primary, shadow), strict=True):
            if record.error:
                key = (side, record.error)
                stats.errors[key] = stats.errors.get(key, 0) + 1
            if record.ttft_s is not None:
                stats.ttft[side].observe(record.ttft_s)
            itl = stats.itl[side]
            for gap in record.itl_s:
                itl.observe(gap)
        for reasons in zip_longest(primary.finish_reasons, shadow.finish_reasons, fillvalue=""):
            key = (reasons[0] or UNFINISHED, reasons[1] or UNFINISHED)
            stats.finish_reasons[key] = stats.finish_reasons.get(key, 0) + 1
        if greedy and not primary.error and not shadow.error:
            self._outputs(stats, primary, shadow, same_tokenizer)

    @staticmethod
    def _outputs(stats: PairStats, primary: Side, shadow: Side, same_tokenizer: bool) -> None:
        basis = "tokens" if same_tokenizer else "text"
        ours: Sequence[Sequence[object]] = primary.token_ids if same_tokenizer else primary.text
        theirs: Sequence[Sequence[object]] = shadow.token_ids if same_tokenizer else shadow.text
        for first, second in zip_longest(ours, theirs, fillvalue=()):
            position = first_difference(first, second)
            if position is None:
                stats.identical[basis] += 1
            else:
                stats.diverged[basis] += 1
                stats.divergence[basis].observe(position)

    def shed(self, primary: str, shadow: str) -> None:
        """Count a copy not made: the mirror had ``max_in_flight`` copies running."""
        self._pair(primary, shadow).copies["shed"] += 1

    def skipped(self, primary: str, shadow: str) -> None:
        """Count a copy not made: the shadow would refuse the request (its capabilities, its tokenizer)."""
        self._pair(primary, shadow).copies["skipped"] += 1

    def cancelled(self, primary: str, shadow: str) -> None:
        """Count a copy aborted with its primary (Abort, client cancel, primary failure)."""
        self._pair(primary, shadow).copies["cancelled"] += 1


__all__ = [
    "BASES",
    "COPY_OUTCOMES",
    "DIVERGENCE_BUCKETS",
    "SIDES",
    "UNFINISHED",
    "Agreement",
    "PairStats",
    "Side",
    "first_difference",
]
