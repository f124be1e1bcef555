"""``spi.streaming``: the output-path helpers every driver shares."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    CumulativeOutput,
    GenerationRequest,
    StopMatch,
    Stopping,
    StopTextHit,
    StopTextMatcher,
    rank_by_logprob,
    resolve_max_tokens,
    select_candidates,
    stop_match_for_token,
)

REPLACEMENT = "\ufffd"

# -- CumulativeOutput -------------------------------------------------------------------------


def test_cumulative_to_deltas() -> None:
    output = CumulativeOutput()
    assert output.update([1], "He") == ([1], "He")
    assert output.update([1, 2], "Hello") == ([2], "llo")
    assert output.update([1, 2], "Hello") == ([], "")
    assert output.tokens_sent == 2


def test_trailing_replacement_characters_are_held_back() -> None:
    """An incomplete UTF-8 sequence decodes to U+FFFD for now; it is never emitted early."""
    output = CumulativeOutput()
    assert output.update([1], "a" + REPLACEMENT) == ([1], "a")
    assert output.update([1, 2], "a" + REPLACEMENT * 2) == ([2], "")
    assert output.update([1, 2, 3], "aé") == ([3], "é")


def test_replacement_inside_the_text_is_stable() -> None:
    output = CumulativeOutput()
    assert output.update([1], "a" + REPLACEMENT + "b") == ([1], "a" + REPLACEMENT + "b")


def test_final_update_flushes_trailing_replacement() -> None:
    output = CumulativeOutput()
    assert output.update([1], "x" + REPLACEMENT) == ([1], "x")
    assert output.update([1], "x" + REPLACEMENT, final=True) == ([], REPLACEMENT)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.text(alphabet="ab é€\U0001f600" + REPLACEMENT, max_size=30),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), max_size=10),
)
def test_cumulative_deltas_concatenate_to_the_final_text(final: str, cuts: list[tuple[int, int]]) -> None:
    """Whatever prefixes (with pending partial characters) the engine reports, the deltas
    concatenate to the final text and never emit anything that is later revised."""
    output = CumulativeOutput()
    emitted = ""
    ids: list[int] = []
    for cut, pending in sorted(cuts):
        ids = list(range(min(cut, len(final))))
        _, text = output.update(ids, final[:cut] + REPLACEMENT * pending)
        emitted += text
        assert final.startswith(emitted)
    _, text = output.update(list(range(len(final))), final, final=True)
    emitted += text
    assert emitted == final
    assert output.tokens_sent == len(final)


# -- StopTextMatcher -------------------------------------------------------------------------


def test_no_stops_passes_text_through() -> None:
    matcher = StopTextMatcher(["", ""], include_stop=False)
    assert matcher.feed("abc") == "abc"
    assert matcher.flush() == ""


def test_partial_match_is_held_back_then_released() -> None:
    matcher = StopTextMatcher(["STOP"], include_stop=False)
    assert matcher.feed("abcST") == "abc"
    assert matcher.feed("O") == ""
    assert matcher.feed("x") == "STOx"
    assert matcher.feed("ST") == ""
    assert matcher.flush() == "ST"
    assert matcher.flush() == ""


def test_match_across_feeds_excludes_or_includes_the_stop() -> None:
    excluding = StopTextMatcher(["END"], include_stop=False)
    assert excluding.feed("hello E") == "hello "
    assert excluding.feed("NDtrailing") == StopTextHit("", "END")
    including = StopTextMatcher(["END"], include_stop=True)
    assert including.feed("hello E") == "hello "
    assert including.feed("ND trailing") == StopTextHit("END", "END")


def test_match_in_one_feed() -> None:
    assert StopTextMatcher(["\n"], include_stop=False).feed("a\nb\n") == StopTextHit("a", "\n")
    assert StopTextMatcher(["\n"], include_stop=True).feed("a\nb\n") == StopTextHit("a\n", "\n")


def test_earliest_match_wins() -> None:
    matcher = StopTextMatcher(["zz", "b"], include_stop=False)
    assert matcher.feed("azzb") == StopTextHit("a", "zz")
    matcher = StopTextMatcher(["zz", "b"], include_stop=False)
    assert matcher.feed("abzz") == StopTextHit("a", "b")


def test_the_stop_that_completes_first_wins_whatever_the_chunking() -> None:
    """A stop string that completes earlier wins over a longer one that started earlier, exactly
    as when the text arrives one character at a time."""
    stops = ["abcd", "bc"]
    whole = StopTextMatcher(stops, include_stop=True).feed("abcd")
    matcher = StopTextMatcher(stops, include_stop=True)
    pieces = [matcher.feed(c) for c in "abcd"]
    assert pieces[:2] == ["", ""]
    assert pieces[2] == StopTextHit("abc", "bc")
    assert whole == pieces[2]


def test_same_end_prefers_the_longer_stop() -> None:
    assert StopTextMatcher(["bc", "abc"], include_stop=True).feed("xabc") == StopTextHit("xabc", "abc")


def test_overlapping_prefixes_are_held() -> None:
    matcher = StopTextMatcher(["aab"], include_stop=False)
    assert matcher.feed("aa") == ""
    assert matcher.feed("a") == "a"  # "aaa": only the last "aa" can still become "aab"
    assert matcher.feed("b") == StopTextHit("", "aab")


def test_unarmed_text_cannot_complete_a_stop_but_may_begin_one() -> None:
    """Before ``min_tokens`` no stop string ends the output; one that starts there and completes
    after it does (the stop straddles the boundary), as in vLLM."""
    matcher = StopTextMatcher(["ab"], include_stop=False)
    assert matcher.feed("xab", armed=False) == "xab"  # completed unarmed: ignored
    assert matcher.feed("a", armed=False) == ""  # held: it may begin "ab"
    assert matcher.feed("b") == StopTextHit("", "ab")
    shorter = StopTextMatcher(["ab", "b"], include_stop=False)
    assert shorter.feed("b", armed=False) == ""  # a whole stop, held unarmed...
    assert shorter.feed("x") == "bx"  # ...is never matched later
    straddling = StopTextMatcher(["i h^"], include_stop=False)
    assert straddling.feed("pwui ", armed=False) == "pwu"
    assert straddling.feed("h") == ""
    assert straddling.feed("^>") == StopTextHit("", "i h^")


def reference(text: str, stops: list[str], include: bool, armed_from: int = 0) -> tuple[str, str | None]:
    """The output of one stream: the text up to the first stop string to complete (ties: the
    one that started first) after the first ``armed_from`` characters, or all of it."""
    for end in range(armed_from + 1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            start = end - len(stop)
            return (text[:end] if include else text[:start]), stop
    return text, None


def run(matcher: StopTextMatcher, chunks: list[str], unarmed: int = 0) -> tuple[str, str | None]:
    """Feed ``chunks``, the first ``unarmed`` of them unarmed."""
    emitted = ""
    for position, chunk in enumerate(chunks):
        result = matcher.feed(chunk, armed=position >= unarmed)
        if isinstance(result, StopTextHit):
            return emitted + result.text, result.stop
        emitted += result
    return emitted + matcher.flush(), None


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


small_text = st.text(alphabet="abc\n", max_size=24)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    small_text,
    st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(0, 24), max_size=8),
    st.booleans(),
)
def test_stop_matcher_matches_the_reference(text: str, stops: list[str], cuts: list[int], include: bool) -> None:
    """However the text is chunked: the output is the input up to the match (with the stop
    when asked), and never contains a stop string before it."""
    output, stop = run(StopTextMatcher(stops, include_stop=include), chunked(text, cuts))
    assert (output, stop) == reference(text, stops, include)
    body = output[: len(output) - len(stop)] if include and stop else output
    assert not any(s in body for s in stops)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    small_text,
    st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(0, 24), max_size=8),
    st.integers(0, 24),
    st.booleans(),
)
def test_stop_matcher_with_unarmed_text_matches_the_reference(
    text: str, stops: list[str], cuts: list[int], boundary: int, include: bool
) -> None:
    """Text before ``min_tokens`` fed unarmed: only a stop string completing after it counts."""
    boundary = min(boundary, len(text))
    before, after = chunked(text[:boundary], cuts), chunked(text[boundary:], cuts)
    output, stop = run(StopTextMatcher(stops, include_stop=include), before + after, unarmed=len(before))
    assert (output, stop) == reference(text, stops, include, armed_from=boundary)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(small_text, st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3))
def test_stop_matcher_holds_back_only_a_possible_stop(text: str, stops: list[str]) -> None:
    """Fed one character at a time, exactly the longest suffix that could still grow into a
    stop string is held back; everything before it is released at once."""
    matcher = StopTextMatcher(stops, include_stop=False)
    fed = emitted = ""
    for char in text:
        fed += char
        result = matcher.feed(char)
        if isinstance(result, StopTextHit):
            return
        emitted += result
        assert fed.startswith(emitted)
        held = fed[len(emitted) :]
        possible = [
            n for n in range(len(fed) + 1) if any(len(s) > n and s.startswith(fed[len(fed) - n :]) for s in stops)
        ]
        assert len(held) == max(possible)


# -- stop_match_for_token ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "stopping", "eos", "expected"),
    [
        (7, Stopping(stop_token_ids=(7,)), [2], StopMatch.token(7)),
        (2, Stopping(), [2, 3], StopMatch.eos(2)),
        (3, Stopping(), [2, 3], StopMatch.eos(3)),
        (2, Stopping(stop_token_ids=(2,)), [2], StopMatch.token(2)),  # the caller named it
        (2, Stopping(ignore_eos=True), [2], None),
        (2, Stopping(stop_token_ids=(2,), ignore_eos=True), [2], StopMatch.token(2)),
        (5, Stopping(stop_token_ids=(7,)), [2], None),
        (0, Stopping(), [0], StopMatch.eos(0)),
    ],
)
def test_stop_match_for_token(token: int, stopping: Stopping, eos: list[int], expected: StopMatch | None) -> None:
    assert stop_match_for_token(token, stopping, eos) == expected


# -- select_candidates ----------------------------------------------------------------------


LOGPROBS = {10: -2.0, 11: -0.5, 12: -1.0, 13: -0.5}


def test_rank_by_logprob_breaks_ties_by_token_id() -> None:
    assert rank_by_logprob(LOGPROBS) == {11: 1, 13: 2, 12: 3, 10: 4}
    assert rank_by_logprob({}) == {}


def test_no_selection_means_no_candidates() -> None:
    assert select_candidates(None, LOGPROBS) == []


def test_top_n_in_rank_order() -> None:
    selection = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=2)
    assert select_candidates(selection, LOGPROBS, decode=lambda i: f"<{i}>") == [
        Candidate(11, -0.5, "<11>", 1),
        Candidate(13, -0.5, "<13>", 2),
    ]
    zero = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=0)
    assert select_candidates(zero, LOGPROBS) == []


def test_token_ids_in_request_order() -> None:
    selection = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, token_ids=(10, 12))
    candidates = select_candidates(selection, LOGPROBS)
    assert [(c.token_id, c.rank) for c in candidates] == [(10, 4), (12, 3)]


def test_a_requested_id_the_engine_did_not_score_is_a_failure_not_a_made_up_value() -> None:
    selection = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, token_ids=(10, 99))
    with pytest.raises(EngineFailure, match=r"no logprob for candidate ids \[99\]") as raised:
        select_candidates(selection, LOGPROBS)
    assert raised.value.code == pb.ERROR_CODE_INTERNAL


def test_all_in_rank_order() -> None:
    selection = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL)
    assert [c.token_id for c in select_candidates(selection, LOGPROBS)] == [11, 13, 12, 10]


def test_engine_ranks_are_used_when_given() -> None:
    """Vocabulary ranks from the engine win over ranks within the returned subset."""
    ranks = {10: 40, 11: 1, 12: 7, 13: 3}
    selection = CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL)
    assert [(c.token_id, c.rank) for c in select_candidates(selection, LOGPROBS, ranks=ranks)] == [
        (11, 1),
        (13, 3),
        (12, 7),
        (10, 40),
    ]


# -- resolve_max_tokens ------------------------------------------------------------------------


def generation(max_tokens: int | None, min_tokens: int = 0) -> GenerationRequest:
    return GenerationRequest("r", "m", prompt="x", stopping=Stopping(max_tokens=max_tokens, min_tokens=min_tokens))


@pytest.mark.parametrize(
    ("max_tokens", "prompt", "context", "output", "expected"),
    [
        (None, 10, 100, None, 90),
        (None, 10, 100, 50, 50),
        (None, 10, 30, 50, 20),
        (None, 10, None, 7, 7),
        (5, 10, 100, None, 5),
        (90, 10, 100, None, 90),
        (5, 10, None, None, 5),
    ],
)
def test_resolve_max_tokens(
    max_tokens: int | None, prompt: int, context: int | None, output: int | None, expected: int
) -> None:
    assert resolve_max_tokens(generation(max_tokens), prompt, context, output) == expected


@pytest.mark.parametrize(
    ("max_tokens", "prompt", "context", "match"),
    [
        (None, 100, 100, "context is 100"),
        (1, 101, 100, "context is 100"),
        (91, 10, 100, "exceeds the context"),
        (None, 10, None, "max_tokens is required"),
    ],
)
def test_resolve_max_tokens_rejections(max_tokens: int | None, prompt: int, context: int | None, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        resolve_max_tokens(generation(max_tokens), prompt, context)


def test_min_tokens_must_fit_the_resolved_budget() -> None:
    assert resolve_max_tokens(generation(None, min_tokens=90), 10, 100) == 90
    with pytest.raises(InvalidArgument, match=r"min_tokens \(91\) exceeds the 90 tokens left"):
        resolve_max_tokens(generation(None, min_tokens=91), 10, 100)
    with pytest.raises(InvalidArgument, match=r"min_tokens \(8\) exceeds the 7 tokens left"):
        resolve_max_tokens(generation(None, min_tokens=8), 10, 100, 7)
    with pytest.raises(InvalidArgument, match=r"min_tokens \(9\) exceeds the 5 tokens left"):
        resolve_max_tokens(generation(5, min_tokens=9), 10, 100)


def test_an_explicit_max_tokens_past_the_model_s_output_limit_is_refused() -> None:
    assert resolve_max_tokens(generation(7), 10, 100, 7) == 7
    with pytest.raises(InvalidArgument, match=r"max_tokens \(8\) exceeds the model's 7 output tokens"):
        resolve_max_tokens(generation(8), 10, 100, 7)
