"""``bench --live``'s split comparison: each split's engines side by side, and each candidate's verdict.

Reads the ``openengine_gateway_engine_*`` families (``server.metrics``): every request counted under
the engine that answered it and the split it came through. Per split, one column per engine (the
baseline first) with the figures of an offline ``bench`` table, then, for each other engine (a
candidate), the verdict of ``judge`` against the baseline: TTFT and ITL by a Mann-Whitney U test on
the two histograms with a ratio at p90, the error rate's difference with its 95% interval, and the
greedy agreement of a mirror from the baseline to the candidate when one ran. The baseline is the
engine named by ``--baseline`` when the split has it, else the engine that answered the most.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import judge
from . import prom
from .report import number, table
from .stats import BucketCounts, Distribution

ENGINE = "openengine_gateway_engine"
HISTOGRAMS = {
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2e": "e2e_latency_seconds",
    "queue": "queue_time_seconds",
}
"""``EngineCounters`` field -> the family's name after ``openengine_gateway_engine_``."""
LIMITS = judge.Limits()
"""What ``bench --live`` judges by (``judge.Limits``' defaults)."""

Member = tuple[str, str]
"""(split, engine)."""


@dataclass
class EngineCounters:
    """One engine's families within one split, as scraped."""

    requests: dict[tuple[str, str], float] = field(default_factory=dict)
    """By (outcome, code), every kind together."""
    tokens: dict[str, float] = field(default_factory=dict)
    """``prompt`` and ``completion``."""
    histograms: dict[str, BucketCounts] = field(default_factory=dict)
    """By ``HISTOGRAMS`` key."""

    def minus(self, earlier: EngineCounters) -> EngineCounters:
        """What was counted since ``earlier``, a scrape of the same gateway."""
        return EngineCounters(
            prom.minus(self.requests, earlier.requests),
            prom.minus(self.tokens, earlier.tokens),
            prom.minus_histograms(self.histograms, earlier.histograms),
        )

    def count(self, outcome: str) -> int:
        return int(sum(n for (ours, _code), n in self.requests.items() if ours == outcome))

    def window(self) -> judge.Window:
        empty = BucketCounts((float("inf"),), (0.0,), 0.0)
        return judge.Window(
            self.count("finished"),
            self.count("failed"),
            self.histograms.get("ttft", empty),
            self.histograms.get("itl", empty),
        )


def parse(text: str, url: str) -> dict[Member, EngineCounters]:
    """Every (split, engine) of the page's engine families that came through a split."""
    samples = prom.samples(text, url, f"{ENGINE}_")
    members: dict[Member, EngineCounters] = {}

    def member(labels: Mapping[str, str]) -> EngineCounters | None:
        if not labels.get("split"):
            return None  # addressed by its own name: in no split
        return members.setdefault((labels["split"], labels["engine"]), EngineCounters())

    for sample in samples.get("requests_total", []):
        if (counters := member(sample.labels)) is not None:
            key = (sample.labels["outcome"], sample.labels["code"])
            counters.requests[key] = counters.requests.get(key, 0.0) + sample.value
    for name in ("prompt", "completion"):
        for sample in samples.get(f"{name}_tokens_total", []):
            if (counters := member(sample.labels)) is not None:
                counters.tokens[name] = sample.value
    for field_name, name in HISTOGRAMS.items():
        for labels, histogram in prom.histograms(samples.get(f"{name}_bucket", []), samples.get(f"{name}_sum", [])):
            if (counters := member(labels)) is not None:
                counters.histograms[field_name] = histogram
    return members


def difference(
    later: Mapping[Member, EngineCounters], earlier: Mapping[Member, EngineCounters]
) -> dict[Member, EngineCounters]:
    """What each engine of each split counted between two scrapes."""
    return {key: counters.minus(earlier.get(key, EngineCounters())) for key, counters in later.items()}


@dataclass(frozen=True)
class SplitComparison:
    """One split: its engines' figures (the baseline first) and each candidate's verdict."""

    split: str
    baseline: str
    engines: dict[str, EngineCounters]
    verdicts: dict[str, judge.Verdict]


def compare(
    members: Mapping[Member, EngineCounters],
    agreement: Mapping[tuple[str, str], tuple[int, int]],
    baseline: str | None = None,
) -> list[SplitComparison]:
    """Each split's comparison, splits in name order; ``agreement``: (identical, compared) greedy outputs
    by (primary, shadow) engine pair, from the mirror families."""
    splits: dict[str, dict[str, EngineCounters]] = {}
    for (split, engine), counters in sorted(members.items()):
        splits.setdefault(split, {})[engine] = counters
    comparisons = []
    for split, engines in splits.items():
        chosen = baseline if baseline in engines else max(engines, key=lambda e: (sum(engines[e].requests.values()), e))
        ordered = {chosen: engines[chosen], **{e: c for e, c in engines.items() if e != chosen}}
        verdicts = {
            engine: judge.judge(engines[chosen].window(), counters.window(), LIMITS, agreement.get((chosen, engine)))
            for engine, counters in ordered.items()
            if engine != chosen
        }
        comparisons.append(SplitComparison(split, chosen, ordered, verdicts))
    return comparisons


def to_text(comparison: SplitComparison, seconds: float | None) -> str:
    """The split's table, one column per engine, then a verdict per candidate."""
    columns = list(comparison.engines.values())
    rows: list[tuple[str, list[str]]] = [
        ("requests finished / failed", [f"{c.count('finished')} / {c.count('failed')}" for c in columns]),
        (
            "aborted / cancelled / refused",
            [f"{c.count('aborted')} / {c.count('cancelled')} / {c.count('rejected')}" for c in columns],
        ),
        ("error rate", [_rate(c) for c in columns]),
    ]
    codes = sorted({code for c in columns for (outcome, code) in c.requests if outcome == "failed"})
    rows.extend((f"error {code}", [str(int(c.requests.get(("failed", code), 0))) for c in columns]) for code in codes)
    if seconds:
        rows.append(("requests/s", [number(sum(c.requests.values()) / seconds, 2) for c in columns]))
        rows.append(("output tokens/s", [number(c.tokens.get("completion", 0) / seconds) for c in columns]))
    rows.append(("prompt tokens", [str(int(c.tokens.get("prompt", 0))) for c in columns]))
    rows.append(("completion tokens", [str(int(c.tokens.get("completion", 0))) for c in columns]))
    for label, key in (("TTFT", "ttft"), ("ITL", "itl"), ("E2E", "e2e"), ("queue", "queue")):
        for stat in ("mean", "p50", "p90", "p99"):
            name = f"{label} (ms) {stat}" if stat == "mean" else f"{'':>{len(label) + 5}} {stat}"
            rows.append((name, [_ms(c, key, stat) for c in columns]))
    headers = [f"{e} (baseline)" if e == comparison.baseline else e for e in comparison.engines]
    lines = table(headers, rows)
    for candidate, verdict in comparison.verdicts.items():
        lines.append(f"{candidate} against {comparison.baseline}: {verdict.result}")
        lines.extend(f"  {check.describe()}" for check in verdict.checks)
    return "\n".join(lines)


def method() -> str:
    """How the verdicts are reached, for the page's header."""
    return (
        f"verdicts: TTFT and ITL fail when p{LIMITS.ttft_percentile:g} is over {LIMITS.ttft_max_ratio:g}x the "
        f"baseline's and a one-sided Mann-Whitney U test on the histogram buckets (ties within a bucket) gives "
        f"p < {LIMITS.alpha:g}; the error rate fails when the {LIMITS.confidence:.0%} interval (Newcombe) of its "
        f"difference lies above +{LIMITS.max_error_delta:g}; under {LIMITS.min_samples} observations a side is "
        "not enough data"
    )


def to_json(comparison: SplitComparison, seconds: float | None) -> dict[str, Any]:
    """The split's figures and verdicts as JSON values (latencies in seconds)."""
    engines = {}
    for engine, counters in comparison.engines.items():
        engines[engine] = {
            "requests": {f"{outcome}/{code}": int(n) for (outcome, code), n in sorted(counters.requests.items())},
            "error_rate": _error_rate(counters),
            "tokens": {name: int(n) for name, n in counters.tokens.items()},
            "latency_s": {key: _distribution(counters, key).__dict__ for key in HISTOGRAMS},
        }
    verdicts = {
        candidate: {
            "result": verdict.result,
            "failing": verdict.failing,
            "latency": [_plain(check) for check in verdict.latency],
            "errors": _plain(verdict.errors),
            "agreement": _plain(verdict.agreement),
        }
        for candidate, verdict in comparison.verdicts.items()
    }
    return {
        "split": comparison.split,
        "baseline": comparison.baseline,
        "seconds": seconds,
        "engines": engines,
        "verdicts": verdicts,
    }


def _plain(check: object) -> Any:
    if check is None:
        return None
    values = dict(check.__dict__)
    test = values.get("test")
    if test is not None:
        values["test"] = dict(test.__dict__)
    values["line"] = check.describe()  # type: ignore[attr-defined]
    return values


def _error_rate(counters: EngineCounters) -> float | None:
    window = counters.window()
    total = window.finished + window.failed
    return window.failed / total if total else None


def _rate(counters: EngineCounters) -> str:
    rate = _error_rate(counters)
    return "-" if rate is None else f"{rate * 100:.2f}%"


def _distribution(counters: EngineCounters, key: str) -> Distribution:
    histogram = counters.histograms.get(key)
    return histogram.distribution() if histogram is not None else Distribution.of([])


def _ms(counters: EngineCounters, key: str, stat: str) -> str:
    value: float | None = getattr(_distribution(counters, key), stat)
    return number(None if value is None else value * 1000.0, 2)


__all__ = [
    "ENGINE",
    "LIMITS",
    "EngineCounters",
    "SplitComparison",
    "compare",
    "difference",
    "method",
    "parse",
    "to_json",
    "to_text",
]
