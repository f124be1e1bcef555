"""``OutputTracker``: one output's stopping and text, token by token, as the contract wants them."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.spi import OutputFinished, OutputTracker, StopMatch, Stopping, TokenRecord, TokenStep, tracking

EOS = 0


def run(stopping: Stopping, tokens: list[tuple[int, str | bytes]], budget: int = 100) -> tuple[list[TokenStep], str]:
    """Feed ``tokens`` until the output ends; the steps and the text they emitted."""
    tracker = OutputTracker(0, stopping, budget=budget, eos_token_ids=(EOS,))
    steps = []
    for token, piece in tokens:
        steps.append(tracker.add(token, piece))
        if tracker.done:
            break
    return steps, "".join(step.delta.text for step in steps)


def ids(steps: list[TokenStep]) -> list[int]:
    return [record.token_id for step in steps for record in step.delta.tokens]


def finish(steps: list[TokenStep]) -> OutputFinished | None:
    return steps[-1].finish


WORD = [(1, "a"), (2, "b"), (3, "c"), (4, "d")]


def test_the_budget_ends_with_length() -> None:
    steps, text = run(Stopping(), WORD, budget=3)
    assert (ids(steps), text) == ([1, 2, 3], "abc")
    assert finish(steps) == OutputFinished(0, pb.FINISH_REASON_LENGTH)
    assert all(step.finish is None for step in steps[:-1])


@pytest.mark.parametrize(("include", "kept", "text"), [(False, [1, 2], "ab"), (True, [1, 2, 3], "abc")])
def test_a_callers_stop_token_stays_only_when_included(include: bool, kept: list[int], text: str) -> None:
    steps, emitted = run(Stopping(stop_token_ids=(3,), include_stop_in_output=include), WORD)
    assert (ids(steps), emitted) == (kept, text)
    assert finish(steps) == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(3))


def test_eos_stays_in_the_records_without_text_unless_ignored() -> None:
    steps, text = run(Stopping(), [(1, "a"), (EOS, "</s>"), (2, "b")])
    assert (ids(steps), text) == ([1, EOS], "a")
    assert finish(steps) == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS))
    steps, text = run(Stopping(ignore_eos=True), [(1, "a"), (EOS, ""), (2, "b")], budget=3)
    assert (ids(steps), text, finish(steps)) == ([1, EOS, 2], "ab", OutputFinished(0, pb.FINISH_REASON_LENGTH))


@pytest.mark.parametrize(("include", "text"), [(False, "a"), (True, "abc")])
def test_a_stop_string_is_held_back_and_cut(include: bool, text: str) -> None:
    tracker = OutputTracker(0, Stopping(stop_texts=("bc",), include_stop_in_output=include), budget=10)
    assert tracker.add(1, "a").delta.text == "a"
    held = tracker.add(2, "b")
    assert held.delta.text == "" and held.delta.tokens == [TokenRecord(2)] and held.finish is None
    hit = tracker.add(3, "c")
    assert "a" + hit.delta.text == text
    assert hit.finish == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("bc"))


def test_held_text_is_released_when_the_output_ends_otherwise() -> None:
    steps, text = run(Stopping(stop_texts=("bz",)), [(1, "a"), (2, "b")], budget=2)
    assert (text, finish(steps)) == ("ab", OutputFinished(0, pb.FINISH_REASON_LENGTH))
    steps, text = run(Stopping(stop_texts=("bz",)), [(1, "a"), (2, "b"), (EOS, "")])
    assert (text, finish(steps)) == ("ab", OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS)))


def test_nothing_ends_the_output_before_min_tokens() -> None:
    tracker = OutputTracker(0, Stopping(min_tokens=2, stop_token_ids=(3,), stop_texts=("x",)), budget=10)
    assert not tracker.may_stop
    for token, piece in [(3, "x"), (EOS, "")]:
        assert tracker.add(token, piece).finish is None
    assert tracker.may_stop
    assert tracker.add(3, "").finish == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(3))
    assert tracker.generated == 3


def test_a_stop_string_begun_before_min_tokens_completes_after() -> None:
    tracker = OutputTracker(0, Stopping(min_tokens=1, stop_texts=("ab",)), budget=10)
    assert tracker.add(1, "a").finish is None
    assert tracker.add(2, "b").finish == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("ab"))


def test_utf8_bytes_split_across_tokens_are_held_until_the_character_completes() -> None:
    euro = "€".encode()
    steps, text = run(Stopping(), [(1, euro[:1]), (2, euro[1:]), (3, b"!")], budget=3)
    assert [step.delta.text for step in steps] == ["", "€", "!"] and text == "€!"


def test_an_unfinished_character_at_the_end_is_a_replacement_character() -> None:
    _, text = run(Stopping(), [(1, b"a"), (2, "€".encode()[:2])], budget=2)
    assert text == "a\ufffd"


def test_a_dropped_stop_token_still_counts_as_generated() -> None:
    tracker = OutputTracker(0, Stopping(stop_token_ids=(3,)), budget=10)
    tracker.add(1, "a")
    tracker.add(3, "c")
    assert tracker.generated == 2 and tracker.done


def test_no_token_after_the_end() -> None:
    tracker = OutputTracker(0, Stopping(), budget=1)
    tracker.add(1, "a")
    with pytest.raises(ValueError, match="already ended"):
        tracker.add(2, "b")


def test_records_carry_what_the_driver_gives() -> None:
    record = TokenRecord(1, "a", -0.5, 1)
    assert OutputTracker(0, Stopping(), budget=5).add(1, "a", record).delta.tokens == [record]


def test_exports() -> None:
    assert tracking.__all__ == ["OutputTracker", "TokenStep"]
