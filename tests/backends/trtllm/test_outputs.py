"""TensorRT-LLM's cumulative outputs → deltas, stops, logprob records and the prefill handoff."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from openengine_backends.trtllm.outputs import RequestStream, position_record
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    GenerationRequest,
    LogprobRequest,
    OutputFinished,
    PrefillDone,
    StopMatch,
    Stopping,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

from .fake_llm import CompletionOutput, Logprob

EOS = 2
PROMPT = [1, 10, 11]


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=PROMPT, **fields)


def result(*outputs: CompletionOutput, finished: bool = False, cached: int = 0) -> SimpleNamespace:
    return SimpleNamespace(prompt_token_ids=PROMPT, outputs=list(outputs), finished=finished, cached_tokens=cached)


def deltas(events: list[Any]) -> list[TokenDelta]:
    return [e for e in events if isinstance(e, TokenDelta)]


def test_cumulative_ids_and_text_become_deltas_with_usage_first_and_last() -> None:
    stream = RequestStream(request(), end_id=EOS)
    out = CompletionOutput(0, "a", [5])
    first = stream.events(result(out, cached=2))
    assert first == [UsageReport(3, 0, 2), TokenDelta(0, [TokenRecord(5)], "a")]
    out.token_ids += [6, 7]
    out.text = "abc"
    assert stream.events(result(out)) == [TokenDelta(0, [TokenRecord(6), TokenRecord(7)], "bc")]
    out.finish_reason = "length"
    assert stream.events(result(out, finished=True)) == [
        UsageReport(3, 3, 0),
        OutputFinished(0, pb.FINISH_REASON_LENGTH),
    ]
    assert stream.done


def test_eos_left_out_by_tensorrt_llm_comes_back_as_a_record_without_text() -> None:
    stream = RequestStream(request(), end_id=EOS)
    out = CompletionOutput(0, "a", [5], finish_reason="stop")
    events = stream.events(result(out, finished=True))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(5), TokenRecord(EOS)], "a")]
    assert events[-2:] == [UsageReport(3, 2, 0), OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS))]


def test_an_eos_already_in_the_output_is_not_added_twice() -> None:
    stream = RequestStream(request(), end_id=EOS)
    events = stream.events(result(CompletionOutput(0, "a", [5, EOS], finish_reason="stop"), finished=True))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(5), TokenRecord(EOS)], "a")]


def test_a_caller_stop_token_is_dropped_or_kept_as_tensorrt_llm_left_it() -> None:
    dropped = RequestStream(request(stopping=Stopping(stop_token_ids=(9,))), end_id=EOS)
    events = dropped.events(result(CompletionOutput(0, "a", [5], finish_reason="stop", stop_reason=9), finished=True))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(5)], "a")]
    assert events[-2:] == [UsageReport(3, 2, 0), OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(9))]
    kept = RequestStream(request(stopping=Stopping(stop_token_ids=(9,), include_stop_in_output=True)), end_id=EOS)
    events = kept.events(result(CompletionOutput(0, "a!", [5, 9], finish_reason="stop", stop_reason=9), finished=True))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(5), TokenRecord(9)], "a!")]
    assert events[-2] == UsageReport(3, 2, 0)


def test_an_eos_id_tensorrt_llm_stops_on_as_a_stop_word_is_still_the_eos() -> None:
    stream = RequestStream(request(stopping=Stopping(stop_token_ids=(9,))), end_id=EOS)
    events = stream.events(result(CompletionOutput(0, "a", [5], finish_reason="stop", stop_reason=7), finished=True))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(5), TokenRecord(7)], "a")]
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(7))


def test_a_partial_stop_string_is_held_back_then_cut() -> None:
    stream = RequestStream(request(stopping=Stopping(stop_texts=("END",))), end_id=EOS)
    out = CompletionOutput(0, "xE", [5, 6])
    assert deltas(stream.events(result(out))) == [TokenDelta(0, [TokenRecord(5), TokenRecord(6)], "x")]
    out.token_ids, out.text = [5, 6, 7], "xEN"
    assert stream.events(result(out)) == [TokenDelta(0, [TokenRecord(7)], "")]
    out.token_ids, out.text = [5, 6, 7, 8], "xENDy"
    events = stream.events(result(out))
    assert events == [
        TokenDelta(0, [TokenRecord(8)], ""),
        UsageReport(3, 4, 0),
        OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("END")),
    ]
    assert stream.done


def test_an_included_stop_string_stays_and_a_held_prefix_is_released_at_the_end() -> None:
    stream = RequestStream(request(stopping=Stopping(stop_texts=("END",), include_stop_in_output=True)), end_id=EOS)
    events = stream.events(result(CompletionOutput(0, "xENDz", [5, 6])))
    assert deltas(events)[0].text == "xEND"
    held = RequestStream(request(stopping=Stopping(stop_texts=("END",))), end_id=EOS)
    out = CompletionOutput(0, "xEN", [5, 6])
    held.events(result(out))
    out.finish_reason = "length"
    assert deltas(held.events(result(out, finished=True))) == [TokenDelta(0, [], "EN")]


def test_stop_strings_complete_only_past_min_tokens() -> None:
    """As in vLLM: the text of the first ``min_tokens`` tokens completes no stop string."""
    stream = RequestStream(request(stopping=Stopping(stop_texts=("a",), min_tokens=1)), end_id=EOS)
    out = CompletionOutput(0, "a", [5])
    assert deltas(stream.events(result(out))) == [TokenDelta(0, [TokenRecord(5)], "a")]
    out.token_ids, out.text = [5, 6], "aba"
    events = stream.events(result(out))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("a"))
    assert deltas(events) == [TokenDelta(0, [TokenRecord(6)], "b")]


def test_a_step_of_several_tokens_is_armed_from_the_min_tokens_boundary_on() -> None:
    """TensorRT-LLM may stream several tokens a step (speculative decoding): only the text of those
    past ``min_tokens`` may complete a stop string."""
    pieces = {5: "x", 6: "a", 7: "y", 8: "a"}
    guarded = RequestStream(
        request(stopping=Stopping(stop_texts=("a",), min_tokens=3)), end_id=EOS, decode=pieces.__getitem__
    )
    events = guarded.events(result(CompletionOutput(0, "xaya", [5, 6, 7, 8])))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("a"))
    assert deltas(events)[0].text == "xay", "the 'a' of token 2 is within min_tokens; token 4's ends the output"


def test_cancelled_and_timed_out_outputs_finish_cancelled_and_unknown_reasons_fail() -> None:
    stream = RequestStream(request(), end_id=EOS)
    events = stream.events(result(CompletionOutput(0, "", [], finish_reason="timeout"), finished=True))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_CANCELLED, message="timed out in TensorRT-LLM")
    broken = RequestStream(request(), end_id=EOS)
    with pytest.raises(EngineFailure, match="not_finished"):
        broken.events(result(CompletionOutput(0, "", [], finish_reason="not_finished"), finished=True))


def row(*entries: tuple[int, float]) -> dict[int, Logprob]:
    return {token: Logprob(logprob, rank) for rank, (token, logprob) in enumerate(entries, start=1)}


def test_logprob_records_carry_the_token_its_rank_and_top_n_candidates() -> None:
    wanted = LogprobRequest(CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=2))
    stream = RequestStream(request(output_logprobs=wanted), end_id=EOS, decode=lambda t: f"<{t}>")
    out = CompletionOutput(0, "ab", [5, 6], logprobs=[row((5, -0.1), (6, -2.0), (7, -3.0)), row((8, -0.5), (6, -1.0))])
    (delta,) = deltas(stream.events(result(out)))
    assert delta.tokens[0] == TokenRecord(
        5, "<5>", -0.1, 1, [Candidate(5, -0.1, "<5>", 1), Candidate(6, -2.0, "<6>", 2)]
    )
    assert delta.tokens[1].logprob == -1.0 and delta.tokens[1].rank == 2


def test_a_sampled_token_outside_the_top_k_has_no_logprob() -> None:
    record = position_record(9, row((5, -0.1)), None, lambda _: "")
    assert record == TokenRecord(9, "", None, None, [])
    assert position_record(9, -0.25, None, lambda _: "") == TokenRecord(9, "", -0.25)


def test_a_decode_engines_first_token_has_no_logprob_and_the_rest_stay_aligned() -> None:
    stream = RequestStream(request(output_logprobs=LogprobRequest()), end_id=EOS)
    out = CompletionOutput(0, "ab", [42, 6], logprobs=[row((6, -0.3))])
    (delta,) = deltas(stream.events(result(out)))
    assert delta.tokens[0].logprob is None and delta.tokens[1].logprob == -0.3
    out.token_ids, out.text, out.logprobs = [42, 6, 7], "abc", [row((6, -0.3)), row((7, -0.4))]
    (delta,) = deltas(stream.events(result(out)))
    assert delta.tokens == [TokenRecord(7, "", -0.4, 1, [])]


def test_a_context_only_request_ends_with_the_handoff() -> None:
    stream = RequestStream(request(), end_id=EOS, prefill=True, transfer_backend="ucx")
    params = SimpleNamespace(ctx_request_id=77, first_gen_tokens=[42], opaque_state=b"s", ctx_dp_rank=0)
    out = CompletionOutput(0, "x", [42], finish_reason="length", disaggregated_params=params)
    events = stream.events(result(out))
    assert isinstance(events[-1], PrefillDone) and events[-1].session.session_id == "77"
    assert events[-2] == UsageReport(3, 1, 0) and stream.done
    cancelled = RequestStream(request(), end_id=EOS, prefill=True)
    with pytest.raises(EngineFailure, match="cancelled"):
        cancelled.events(result(CompletionOutput(0, "", [], finish_reason="cancelled"), finished=True))
    empty = RequestStream(request(), end_id=EOS, prefill=True)
    with pytest.raises(EngineFailure, match="without a handoff"):
        empty.events(result(CompletionOutput(0, "x", [4], finish_reason="length"), finished=True))
