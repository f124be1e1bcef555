"""Does a candidate engine do worse than its baseline? The statistics of a split's A/B verdicts.

Pure functions over what the gateway's metrics hold, used alike by ``bench --live`` (from scraped
pages) and by a split's canary analysis (``core.canary``, from the gateway's own telemetry):

* **Latency** (TTFT, ITL): a one-sided Mann-Whitney U test on the two histograms, as Kayenta's judge
  compares a canary with its baseline. Observations in one bucket are ties (each pair of a baseline and
  a candidate observation in the same bucket counts one half), with the tie-corrected normal
  approximation and a continuity correction. The candidate fails a latency limit when it is
  significantly slower (``p < alpha``) *and* its percentile is above ``max_ratio`` times the
  baseline's (percentiles interpolated within buckets, as Prometheus' ``histogram_quantile``): the
  test alone would fail a difference too small to matter, the ratio alone a difference that is noise.
* **Errors**: the difference of the two error rates (candidate minus baseline) with Newcombe's hybrid
  score interval (Wilson intervals of each rate combined), which stays sound at zero errors. The
  candidate fails when the whole interval lies above ``max_delta``.
* **Either side with fewer than ``min_samples`` observations** gives "not enough data", never a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .bench.stats import BucketCounts

Result = Literal["pass", "fail", "not enough data"]

MIN_SAMPLES = 20
"""Observations each side needs before a verdict (the normal approximation of U wants about 20)."""


@dataclass(frozen=True)
class MannWhitney:
    """The U test of "the candidate's values are stochastically greater than the baseline's"."""

    u: float
    """Pairs (baseline, candidate) where the candidate's observation is greater, ties counting 1/2."""
    effect: float
    """``u / (n_baseline * n_candidate)``: the chance a candidate observation exceeds a baseline one (0.5: alike)."""
    z: float
    p_greater: float
    """One-sided p-value: the chance of a U this large if both came from one distribution."""


def mann_whitney(baseline: Sequence[float], candidate: Sequence[float]) -> MannWhitney:
    """The test on two histograms' per-bucket counts (not cumulative; the same buckets, ascending).
    Raises ``ValueError`` when either side is empty or the buckets differ in number."""
    if len(baseline) != len(candidate):
        raise ValueError(f"the histograms have {len(baseline)} and {len(candidate)} buckets")
    n1, n2 = sum(baseline), sum(candidate)
    if n1 <= 0 or n2 <= 0:
        raise ValueError("each side needs an observation")
    u = below = ties = 0.0
    for ours, theirs in zip(baseline, candidate, strict=True):
        u += theirs * (below + ours / 2)
        below += ours
        tied = ours + theirs
        ties += tied**3 - tied
    total = n1 + n2
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:  # every observation in one bucket: no evidence either way
        return MannWhitney(u, u / (n1 * n2), 0.0, 0.5)
    corrected = max(abs(u - mean) - 0.5, 0.0)  # continuity correction, towards the mean
    z = math.copysign(corrected, u - mean) / math.sqrt(variance)
    return MannWhitney(u, u / (n1 * n2), z, 0.5 * math.erfc(z / math.sqrt(2)))


def per_bucket(histogram: BucketCounts) -> list[float]:
    """A histogram's counts per bucket, from its cumulative ones."""
    return [now - then for now, then in zip(histogram.cumulative, (0.0, *histogram.cumulative[:-1]), strict=True)]


@dataclass(frozen=True)
class LatencyVerdict:
    """A candidate's latency against its baseline's at one percentile."""

    metric: str
    """``TTFT`` or ``ITL``."""
    percentile: float
    max_ratio: float
    baseline_n: int
    candidate_n: int
    baseline: float | None
    """The baseline's percentile (seconds)."""
    candidate: float | None
    ratio: float | None
    """``candidate / baseline``."""
    test: MannWhitney | None
    result: Result

    def describe(self) -> str:
        """One line: the figures and why the result."""
        head = f"{self.metric} p{self.percentile:g}"
        sizes = f"n={self.baseline_n}/{self.candidate_n}"
        if self.result == "not enough data" or self.test is None:
            return f"{head}: not enough data ({sizes}, each side needs {MIN_SAMPLES})"
        ratio = f"{self.ratio:.2f}x" if self.ratio is not None else "-"
        return (
            f"{head}: {_ms(self.candidate)} vs {_ms(self.baseline)} ms = {ratio} (limit {self.max_ratio:g}x), "
            f"Mann-Whitney p={self.test.p_greater:.3g} ({sizes}): {self.result}"
        )


def compare_latency(
    metric: str,
    baseline: BucketCounts,
    candidate: BucketCounts,
    *,
    percentile: float = 90.0,
    max_ratio: float = 1.2,
    alpha: float = 0.01,
    min_samples: int = MIN_SAMPLES,
) -> LatencyVerdict:
    """The candidate fails when it is slower by the U test (``p < alpha``) and its percentile is above
    ``max_ratio`` times the baseline's."""
    n1, n2 = baseline.count, candidate.count
    if n1 < min_samples or n2 < min_samples:
        return LatencyVerdict(metric, percentile, max_ratio, n1, n2, None, None, None, None, "not enough data")
    ours, theirs = baseline.quantile(percentile / 100), candidate.quantile(percentile / 100)
    ratio = theirs / ours if ours and theirs is not None else None
    test = mann_whitney(per_bucket(baseline), per_bucket(candidate))
    worse = test.p_greater < alpha and (ratio is None or ratio > max_ratio)
    return LatencyVerdict(metric, percentile, max_ratio, n1, n2, ours, theirs, ratio, test, "fail" if worse else "pass")


def wilson(failures: float, total: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of a rate ``failures / total`` (``total`` > 0)."""
    rate = failures / total
    centre = (rate + z * z / (2 * total)) / (1 + z * z / total)
    half = z / (1 + z * z / total) * math.sqrt(rate * (1 - rate) / total + z * z / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class ErrorVerdict:
    """The candidate's error rate against the baseline's."""

    baseline_errors: int
    baseline_n: int
    candidate_errors: int
    candidate_n: int
    delta: float | None
    """Candidate rate minus baseline rate."""
    low: float | None
    high: float | None
    """The ``confidence`` interval of ``delta``."""
    confidence: float
    max_delta: float
    result: Result

    def describe(self) -> str:
        """One line: the rates, the interval and why the result."""
        sizes = f"{self.candidate_errors}/{self.candidate_n} vs {self.baseline_errors}/{self.baseline_n}"
        if self.delta is None or self.low is None or self.high is None:
            return f"error rate: not enough data ({sizes}, each side needs {MIN_SAMPLES} requests)"
        return (
            f"error rate: {sizes}, delta {self.delta:+.4f} ({self.confidence:.0%} CI {self.low:+.4f}.."
            f"{self.high:+.4f}, limit {self.max_delta:+.4f}): {self.result}"
        )


def compare_errors(
    baseline_errors: int,
    baseline_n: int,
    candidate_errors: int,
    candidate_n: int,
    *,
    max_delta: float = 0.01,
    confidence: float = 0.95,
    min_samples: int = MIN_SAMPLES,
) -> ErrorVerdict:
    """The candidate fails when the interval of its error rate minus the baseline's lies above ``max_delta``."""
    verdict = ErrorVerdict(
        baseline_errors, baseline_n, candidate_errors, candidate_n, None, None, None, confidence, max_delta, "pass"
    )
    if baseline_n < min_samples or candidate_n < min_samples:
        return replace(verdict, result="not enough data")
    low, high = rate_difference(baseline_errors, baseline_n, candidate_errors, candidate_n, confidence)
    delta = candidate_errors / candidate_n - baseline_errors / baseline_n
    return replace(verdict, delta=delta, low=low, high=high, result="fail" if low > max_delta else "pass")


def rate_difference(
    baseline_errors: float, baseline_n: float, candidate_errors: float, candidate_n: float, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``candidate rate - baseline rate`` (both ``n`` > 0)."""
    z = _normal_quantile(0.5 + confidence / 2)
    p1, p2 = baseline_errors / baseline_n, candidate_errors / candidate_n
    l1, u1 = wilson(baseline_errors, baseline_n, z)
    l2, u2 = wilson(candidate_errors, candidate_n, z)
    delta = p2 - p1
    return delta - math.hypot(p2 - l2, u1 - p1), delta + math.hypot(u2 - p2, p1 - l1)


def agreement_result(identical: int, outputs: int, minimum: float, min_samples: int = MIN_SAMPLES) -> Result:
    """Greedy output agreement against a minimum share: fails below it, once ``min_samples`` outputs compared."""
    if outputs < min_samples:
        return "not enough data"
    return "pass" if identical / outputs >= minimum else "fail"


@dataclass(frozen=True)
class Window:
    """What one engine of a split did over a window: its Generate streams and their latencies."""

    finished: int
    failed: int
    """Streams that ended with an engine error."""
    ttft: BucketCounts
    itl: BucketCounts


@dataclass(frozen=True)
class Limits:
    """What a candidate must hold against its baseline; ``None`` leaves a figure unjudged."""

    ttft_percentile: float = 90.0
    ttft_max_ratio: float | None = 1.2
    itl_percentile: float = 90.0
    itl_max_ratio: float | None = 1.2
    max_error_delta: float | None = 0.01
    min_agreement: float | None = None
    """The least share of greedy mirrored outputs identical on the baseline and the candidate."""
    alpha: float = 0.01
    """The U test's significance level."""
    confidence: float = 0.95
    """Of the error-rate difference's interval."""
    min_samples: int = MIN_SAMPLES


@dataclass(frozen=True)
class AgreementVerdict:
    """Greedy outputs of requests the baseline answered and the candidate ran as a mirror's shadow."""

    identical: int
    outputs: int
    minimum: float | None
    result: Result

    def describe(self) -> str:
        share = f"{self.identical / self.outputs:.1%} of {self.outputs}" if self.outputs else "none"
        limit = f" (minimum {self.minimum:.1%})" if self.minimum is not None else ""
        return f"greedy agreement: {share} identical{limit}: {self.result}"


@dataclass(frozen=True)
class Verdict:
    """Every judged figure of a candidate against its baseline."""

    latency: tuple[LatencyVerdict, ...]
    errors: ErrorVerdict | None
    agreement: AgreementVerdict | None

    @property
    def checks(self) -> list[LatencyVerdict | ErrorVerdict | AgreementVerdict]:
        return [*self.latency, *([self.errors] if self.errors else []), *([self.agreement] if self.agreement else [])]

    @property
    def result(self) -> Result:
        """``fail`` when any limit fails; else ``not enough data`` when any lacks it; else ``pass``."""
        results = {check.result for check in self.checks}
        return "fail" if "fail" in results else "not enough data" if "not enough data" in results else "pass"

    @property
    def failing(self) -> list[str]:
        """The lines of the limits that failed."""
        return [check.describe() for check in self.checks if check.result == "fail"]


def judge(baseline: Window, candidate: Window, limits: Limits, agreement: tuple[int, int] | None = None) -> Verdict:
    """The candidate against the baseline under ``limits``; ``agreement``: (identical, compared) greedy
    outputs of a mirror from the baseline to the candidate, None when no such mirror runs."""
    latency = []
    for metric, ours, theirs, percentile, ratio in (
        ("TTFT", baseline.ttft, candidate.ttft, limits.ttft_percentile, limits.ttft_max_ratio),
        ("ITL", baseline.itl, candidate.itl, limits.itl_percentile, limits.itl_max_ratio),
    ):
        if ratio is not None:
            latency.append(
                compare_latency(
                    metric,
                    ours,
                    theirs,
                    percentile=percentile,
                    max_ratio=ratio,
                    alpha=limits.alpha,
                    min_samples=limits.min_samples,
                )
            )
    errors = None
    if limits.max_error_delta is not None:
        errors = compare_errors(
            baseline.failed,
            baseline.finished + baseline.failed,
            candidate.failed,
            candidate.finished + candidate.failed,
            max_delta=limits.max_error_delta,
            confidence=limits.confidence,
            min_samples=limits.min_samples,
        )
    agreed = None
    if limits.min_agreement is not None or agreement is not None:
        identical, outputs = agreement or (0, 0)
        result: Result = "pass"
        if limits.min_agreement is not None:
            result = agreement_result(identical, outputs, limits.min_agreement, limits.min_samples)
        agreed = AgreementVerdict(identical, outputs, limits.min_agreement, result)
    return Verdict(tuple(latency), errors, agreed)


def _normal_quantile(p: float) -> float:
    """The standard normal quantile, by bisection on ``erfc`` (exact enough, and no dependency)."""
    low, high = -10.0, 10.0
    for _ in range(100):
        middle = (low + high) / 2
        if 0.5 * math.erfc(-middle / math.sqrt(2)) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


__all__ = [
    "MIN_SAMPLES",
    "AgreementVerdict",
    "ErrorVerdict",
    "LatencyVerdict",
    "Limits",
    "MannWhitney",
    "Result",
    "Verdict",
    "Window",
    "agreement_result",
    "compare_errors",
    "compare_latency",
    "judge",
    "mann_whitney",
    "per_bucket",
    "rate_difference",
    "wilson",
]
