"""The A/B statistics against values computed by hand (and Newcombe's published example)."""

from __future__ import annotations

import math

import pytest
from openengine_gateway.bench.stats import BucketCounts
from openengine_gateway.judge import (
    agreement_result,
    compare_errors,
    compare_latency,
    mann_whitney,
    per_bucket,
    rate_difference,
    wilson,
)


def test_mann_whitney_without_ties() -> None:
    # every candidate observation above every baseline one: U = 3 * 3 = 9, mean 4.5, variance 3*3*7/12 = 5.25,
    # z = (9 - 4.5 - 0.5) / sqrt(5.25) = 1.74574, one-sided p = 1 - Phi(1.74574) = 0.04043
    test = mann_whitney([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1])
    assert test.u == 9 and test.effect == 1.0
    assert test.z == pytest.approx(4 / math.sqrt(5.25))
    assert test.p_greater == pytest.approx(0.04043, abs=1e-5)


def test_mann_whitney_counts_a_shared_bucket_as_ties() -> None:
    # U = 1 * (2 + 1/2) + 2 * 3 = 8.5; ties: three buckets of 2, sum(t^3 - t) = 18, N = 6;
    # variance = 9/12 * (7 - 18/30) = 4.8; z = (8.5 - 4.5 - 0.5) / sqrt(4.8) = 1.59752; p = 0.05507
    test = mann_whitney([2, 1, 0], [0, 1, 2])
    assert test.u == 8.5
    assert test.z == pytest.approx(3.5 / math.sqrt(4.8))
    assert test.p_greater == pytest.approx(0.05507, abs=1e-5)


def test_mann_whitney_of_alike_sides_and_of_one_bucket() -> None:
    assert mann_whitney([5, 5], [5, 5]).p_greater == pytest.approx(0.5)
    assert mann_whitney([7, 0], [3, 0]).p_greater == 0.5  # no spread: no evidence
    with pytest.raises(ValueError, match="each side"):
        mann_whitney([0, 0], [1, 0])


def test_wilson_and_newcombe_intervals() -> None:
    low, high = wilson(0, 20, 1.959964)
    assert low == 0.0 and high == pytest.approx(0.16113, abs=1e-5)  # 0 of 20: (z^2/n) / (1 + z^2/n)
    # Newcombe (1998), Statistics in Medicine 17:873, example (a), method 10: 56/70 - 48/80 -> 0.0524..0.3339
    low, high = rate_difference(48, 80, 56, 70)
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)


def test_error_verdicts() -> None:
    assert compare_errors(0, 19, 5, 100).result == "not enough data"
    # 5 of 100 against 0 of 300: the interval's low end (about 0.0195) is above a 1% limit
    failing = compare_errors(0, 300, 5, 100)
    assert failing.result == "fail" and failing.low is not None and failing.low > 0.01
    assert compare_errors(1, 300, 1, 100).result == "pass"
    assert "error rate: 5/100 vs 0/300" in failing.describe()


def histogram(bounds: tuple[float, ...], counts: list[int]) -> BucketCounts:
    cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
    return BucketCounts((*bounds, math.inf), tuple(float(c) for c in cumulative), 0.0)


BOUNDS = (0.01, 0.02, 0.03, 0.04)


def test_latency_verdicts() -> None:
    baseline = histogram(BOUNDS, [0, 40, 0, 0, 0])  # all in (0.01, 0.02]
    slower = histogram(BOUNDS, [0, 0, 40, 0, 0])  # all in (0.02, 0.03]
    assert per_bucket(slower) == [0, 0, 40, 0, 0]
    verdict = compare_latency("TTFT", baseline, slower, percentile=90, max_ratio=1.2)
    # p90 interpolated in its bucket: 0.01 + 0.01 * 0.9 = 0.019 and 0.029: ratio 1.526
    assert verdict.result == "fail" and verdict.ratio == pytest.approx(0.029 / 0.019)
    assert verdict.test is not None and verdict.test.p_greater < 1e-6
    assert compare_latency("TTFT", baseline, slower, max_ratio=1.6).result == "pass"  # slower, within the limit
    assert compare_latency("TTFT", baseline, baseline).result == "pass"
    few = histogram(BOUNDS, [0, 0, 19, 0, 0])
    assert compare_latency("TTFT", baseline, few).result == "not enough data"
    assert "n=40/19" in compare_latency("TTFT", baseline, few).describe()


def test_agreement_result() -> None:
    assert agreement_result(19, 19, 0.9) == "not enough data"
    assert agreement_result(18, 20, 0.9) == "pass"
    assert agreement_result(17, 20, 0.9) == "fail"
