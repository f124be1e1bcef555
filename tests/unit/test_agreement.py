"""Mirror agreement statistics, each figure hand-computed from the two sides given."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from openengine_gateway.core.agreement import Agreement, PairStats, Side, first_difference
from openengine_gateway.core.telemetry import Histogram


def side(
    engine: str,
    tokens: list[list[int]],
    *,
    text: list[str] | None = None,
    reasons: list[str] | None = None,
    ttft_s: float | None = 0.1,
    itl_s: list[float] | None = None,
    error: str = "",
) -> Side:
    return Side(
        engine=engine,
        token_ids=tokens,
        text=text if text is not None else ["".join(chr(97 + t % 26) for t in ids) for ids in tokens],
        finish_reasons=reasons if reasons is not None else ["STOP"] * len(tokens),
        ttft_s=ttft_s,
        itl_s=itl_s if itl_s is not None else [],
        error=error,
    )


def observed(histogram: Histogram) -> list[float]:
    """The upper bounds of the buckets holding each observation, in order (one entry per observation)."""
    bounds = (*histogram.bounds, float("inf"))
    return [bound for bound, count in zip(bounds, histogram.counts, strict=True) for _ in range(count)]


def compare(primary: Side, shadow: Side, *, greedy: bool = True, same_tokenizer: bool = True) -> PairStats:
    agreement = Agreement()
    agreement.compared(primary, shadow, greedy=greedy, same_tokenizer=same_tokenizer)
    return agreement.pairs[primary.engine, shadow.engine]


@pytest.mark.parametrize(
    ("first", "second", "position"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [7, 2, 3], 0),
        ([1, 2], [1, 2, 3, 4], 2),
        ([1, 2, 3, 4], [1, 2], 2),
        ([], [5], 0),
        ([], [], None),
        ("héllo", "hélp", 3),
    ],
)
def test_first_difference(first: Sequence[object], second: Sequence[object], position: int | None) -> None:
    assert first_difference(first, second) == position


def test_identical_greedy_outputs() -> None:
    stats = compare(side("a", [[1, 2, 3]]), side("b", [[1, 2, 3]]))
    assert stats.copies == {"compared": 1, "shed": 0, "skipped": 0, "cancelled": 0}
    assert stats.identical == {"tokens": 1, "text": 0}
    assert stats.diverged == {"tokens": 0, "text": 0}
    assert observed(stats.divergence["tokens"]) == []
    assert stats.finish_reasons == {("STOP", "STOP"): 1}


def test_divergence_at_k_lands_in_its_bucket_with_its_exact_sum() -> None:
    stats = compare(side("a", [[0, 1, 2, 3, 4, 5, 6]]), side("b", [[0, 1, 2, 3, 4, 9, 6]]))
    assert stats.diverged["tokens"] == 1 and stats.identical["tokens"] == 0
    assert observed(stats.divergence["tokens"]) == [8.0]  # 5 falls in (4, 8]
    assert stats.divergence["tokens"].total == 5


def test_a_strict_prefix_diverges_at_the_shorter_length() -> None:
    stats = compare(side("a", [[1, 2]], reasons=["STOP"]), side("b", [[1, 2, 3, 4]], reasons=["LENGTH"]))
    assert stats.diverged["tokens"] == 1
    assert stats.divergence["tokens"].total == 2
    assert stats.finish_reasons == {("STOP", "LENGTH"): 1}


def test_each_output_of_n_is_compared_with_the_same_index() -> None:
    primary = side("a", [[1, 2], [3, 4], [5, 6]], reasons=["STOP", "LENGTH", "STOP"])
    shadow = side("b", [[1, 2], [3, 0], [5, 6]], reasons=["STOP", "LENGTH", ""])
    stats = compare(primary, shadow)
    assert stats.identical["tokens"] == 2 and stats.diverged["tokens"] == 1
    assert stats.divergence["tokens"].total == 1
    assert stats.finish_reasons == {("STOP", "STOP"): 1, ("LENGTH", "LENGTH"): 1, ("STOP", "UNFINISHED"): 1}


def test_an_output_one_side_lacks_diverges_at_zero_and_is_unfinished() -> None:
    stats = compare(side("a", [[1], [2]]), side("b", [[1]]))
    assert stats.identical["tokens"] == 1 and stats.diverged["tokens"] == 1
    assert observed(stats.divergence["tokens"]) == [0.0]
    assert stats.finish_reasons == {("STOP", "STOP"): 1, ("STOP", "UNFINISHED"): 1}


def test_without_a_shared_tokenizer_text_is_compared_in_characters() -> None:
    primary = side("a", [[1, 2, 3]], text=["the cat sat"])
    shadow = side("b", [[7, 8]], text=["the cap sat"])
    stats = compare(primary, shadow, same_tokenizer=False)
    assert stats.diverged == {"tokens": 0, "text": 1}
    assert stats.divergence["text"].total == 6
    assert observed(stats.divergence["tokens"]) == []
    same_text = compare(primary, side("b", [[9]], text=["the cat sat"]), same_tokenizer=False)
    assert same_text.identical == {"tokens": 0, "text": 1}


def test_non_greedy_requests_count_latency_reasons_and_errors_but_not_outputs() -> None:
    stats = compare(
        side("a", [[1, 2, 3]], ttft_s=0.02, itl_s=[0.003, 0.007]),
        side("b", [[4, 5, 6]], ttft_s=0.3, itl_s=[0.05]),
        greedy=False,
    )
    assert stats.identical == {"tokens": 0, "text": 0} and stats.diverged == {"tokens": 0, "text": 0}
    assert observed(stats.ttft["primary"]) == [0.025] and observed(stats.ttft["shadow"]) == [0.5]
    assert observed(stats.itl["primary"]) == [0.005, 0.01] and stats.itl["primary"].total == pytest.approx(0.01)
    assert observed(stats.itl["shadow"]) == [0.06]
    assert stats.finish_reasons == {("STOP", "STOP"): 1}


def test_a_shadow_error_is_counted_by_code_and_its_output_not_compared() -> None:
    agreement = Agreement()
    for _ in range(2):
        agreement.compared(
            side("a", [[1, 2, 3]]),
            side("b", [[1]], reasons=[""], ttft_s=None, error="ENGINE_OVERLOADED"),
            greedy=True,
            same_tokenizer=True,
        )
    stats = agreement.pairs["a", "b"]
    assert stats.copies["compared"] == 2
    assert stats.errors == {("shadow", "ENGINE_OVERLOADED"): 2}
    assert stats.identical["tokens"] == 0 and stats.diverged["tokens"] == 0
    assert stats.finish_reasons == {("STOP", "UNFINISHED"): 2}
    assert observed(stats.ttft["shadow"]) == [] and len(observed(stats.ttft["primary"])) == 2


def test_copies_not_made_or_cancelled_are_counted_per_pair() -> None:
    agreement = Agreement()
    agreement.shed("a", "b")
    agreement.shed("a", "b")
    agreement.skipped("a", "b")
    agreement.cancelled("a", "b")
    agreement.cancelled("c", "b")
    assert agreement.pairs["a", "b"].copies == {"compared": 0, "shed": 2, "skipped": 1, "cancelled": 1}
    assert agreement.pairs["c", "b"].copies == {"compared": 0, "shed": 0, "skipped": 0, "cancelled": 1}
