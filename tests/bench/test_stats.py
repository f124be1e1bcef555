"""``bench.stats``: percentiles, TPOT against ITL when tokens are coalesced, errors, agreement."""

from __future__ import annotations

import pytest
from openengine_gateway.bench import (
    Distribution,
    RequestRecord,
    Target,
    TargetRun,
    agreement,
    common_prefix_fraction,
    compare,
    summarize,
    throughput_over_time,
    tpot,
    ttft,
)


def _record(index: int, arrivals: list[tuple[float, int]], *, ended: float, error: str | None = None) -> RequestRecord:
    """A request sent at 0 whose token messages arrive at the given times with the given token counts."""
    record = RequestRecord(index, started=0.0, ended=ended, error=error)
    for at, tokens in arrivals:
        record.message_times.append(at)
        record.message_tokens.append(tokens)
        record.token_ids.extend(range(len(record.token_ids), len(record.token_ids) + tokens))
    record.completion_tokens = record.output_tokens
    return record


def _run(label: str, records: list[RequestRecord], duration: float = 1.0) -> TargetRun:
    return TargetRun(Target("host:1", label), "mock 0", duration, records)


def test_distribution_interpolates_percentiles_linearly() -> None:
    distribution = Distribution.of([float(v) for v in range(1, 101)])
    assert distribution.count == 100 and distribution.mean == pytest.approx(50.5)
    assert (distribution.p50, distribution.p90, distribution.p99) == pytest.approx((50.5, 90.1, 99.01))
    assert Distribution.of([3.0]) == Distribution(1, 3.0, 3.0, 3.0, 3.0)
    assert Distribution.of([]) == Distribution(0, None, None, None, None)


def test_coalescing_changes_itl_but_not_tpot() -> None:
    """Eight tokens over the same 70 ms: one a message every 10 ms, or two messages of four."""
    streamed = _record(0, [(0.1 + 0.01 * i, 1) for i in range(8)], ended=0.17)
    coalesced = _record(1, [(0.1, 1), (0.13, 3), (0.17, 4)], ended=0.17)
    assert ttft(streamed) == ttft(coalesced) == pytest.approx(0.1)
    assert tpot(streamed) == tpot(coalesced) == pytest.approx(0.01)
    one, other = summarize(_run("a", [streamed])), summarize(_run("b", [coalesced]))
    assert one.itl_s.count == 7 and one.itl_s.mean == pytest.approx(0.01)
    assert other.itl_s.count == 2 and other.itl_s.mean == pytest.approx(0.035)
    assert one.tpot_s.mean == pytest.approx(other.tpot_s.mean)
    assert one.tokens_per_message.mean == 1.0 and other.tokens_per_message.mean == pytest.approx(8 / 3)
    assert one.messages == 8 and other.messages == 3


def test_tpot_needs_two_tokens_and_ttft_one() -> None:
    assert tpot(_record(0, [(0.2, 1)], ended=0.3)) is None
    assert ttft(_record(0, [], ended=0.3)) is None and tpot(_record(0, [], ended=0.3)) is None


def test_summary_counts_errors_by_code_and_throughput_over_finished_requests() -> None:
    records = [
        _record(0, [(0.1, 2), (0.2, 2)], ended=0.25),
        _record(1, [(0.1, 1)], ended=0.3, error="ERROR_CODE_OVERLOADED"),
        _record(2, [], ended=0.01, error="UNAVAILABLE"),
        _record(3, [], ended=0.01, error="UNAVAILABLE"),
    ]
    summary = summarize(_run("a", records, duration=2.0))
    assert (summary.requests, summary.completed, summary.failed) == (4, 1, 3)
    assert summary.errors == {"UNAVAILABLE": 2, "ERROR_CODE_OVERLOADED": 1}
    assert summary.output_tokens == summary.usage_completion_tokens == 4
    assert summary.output_tokens_per_s == 2.0 and summary.requests_per_s == 0.5
    assert summary.e2e_s.count == 1 and summary.e2e_s.mean == pytest.approx(0.25)
    assert summary.cached_prompt_tokens is None


def test_agreement_over_requests_both_targets_finished() -> None:
    def run(label: str, outputs: dict[int, list[int] | None]) -> TargetRun:
        records = []
        for index, ids in outputs.items():
            record = RequestRecord(index, 0.0, 1.0, error=None if ids is not None else "CANCELLED")
            record.token_ids = ids or []
            records.append(record)
        return _run(label, records)

    baseline = run("a", {0: [1, 2, 3, 4], 1: [5, 6, 7, 8], 2: [1], 3: [9, 9]})
    other = run("b", {0: [1, 2, 3, 4], 1: [5, 6, 0, 0], 2: None, 3: [9, 9, 9, 9]})
    result = agreement(baseline, other)
    assert (result.baseline, result.target, result.compared) == ("host:1/a", "host:1/b", 3)
    assert result.identical == pytest.approx(1 / 3)
    assert result.common_prefix == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    assert compare([baseline, other], greedy=True).agreements == (result,)
    assert compare([baseline, other], greedy=False).agreements == ()
    assert agreement(baseline, run("c", {7: [1]})).identical is None


def test_common_prefix_fraction_is_over_the_longer_output() -> None:
    assert common_prefix_fraction([], []) == 1.0
    assert common_prefix_fraction([1, 2], []) == 0.0
    assert common_prefix_fraction([1, 2, 3], [1, 2, 3]) == 1.0
    assert common_prefix_fraction([1, 2], [1, 2, 3, 4]) == 0.5
    assert common_prefix_fraction([7, 2, 3], [1, 2, 3]) == 0.0


def test_throughput_over_time_bins_every_received_token() -> None:
    records = [_record(0, [(0.05, 3), (0.95, 1)], ended=1.0), _record(1, [(0.5, 2), (1.0, 4)], ended=1.0)]
    series = throughput_over_time(records, 1.0, bins=4)
    assert [t for t, _ in series] == pytest.approx([0.125, 0.375, 0.625, 0.875])
    assert [rate * 0.25 for _, rate in series] == pytest.approx([3, 0, 2, 5])
    assert throughput_over_time(records, 0.0) == []
