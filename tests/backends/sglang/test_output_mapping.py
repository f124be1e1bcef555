"""SGLang's cumulative output dictionaries → generation events, without SGLang.

Fixtures are literal dictionaries in the shape SGLang 0.5.23's ``TokenizerManager`` yields for a
streamed request (``_handle_batch_output``, ``add_logprob_to_meta_info``, ``_handle_abort_req``).
"""

from __future__ import annotations

from typing import Any

import pytest
from openengine_backends.sglang.outputs import RequestStream, abort_failure, token_record
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    GenerationRequest,
    KvSession,
    LogprobRequest,
    OutputFinished,
    PromptTokens,
    Sampling,
    StopMatch,
    Stopping,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

EOS = 1
PROMPT = [10, 11, 12]
TOP_N, IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=PROMPT, **fields)


def out(text: str, ids: list[int], finish: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    """One streamed dictionary: cumulative text and ids, and ``meta_info``."""
    info = {
        "id": "0000000000000001-r-0",
        "finish_reason": finish,
        "prompt_tokens": 3,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
    }
    return {"text": text, "output_ids": ids, "meta_info": info | meta}


def stream(req: GenerationRequest, **kw: Any) -> RequestStream:
    """A request's stream whose up-front usage report (see the first test) was already taken."""
    made = RequestStream(req, eos_token_ids=(EOS,), prompt_ids=PROMPT, **kw)
    (usage,) = made.events(0, out("", []))
    assert isinstance(usage, UsageReport) and usage.prompt_tokens == 3
    return made


def test_the_first_chunk_reports_usage_up_front() -> None:
    """So a request aborted mid-stream still counts its prompt."""
    s = RequestStream(request(), eos_token_ids=(EOS,), prompt_ids=PROMPT)
    assert s.events(0, out("h", [104])) == [UsageReport(3, 1, 0), TokenDelta(0, [TokenRecord(104)], "h")]
    assert s.events(0, out("hi", [104, 105])) == [TokenDelta(0, [TokenRecord(105)], "i")]


def test_cumulative_text_and_ids_become_deltas() -> None:
    s = stream(request())
    assert s.events(0, out("he", [104, 101])) == [TokenDelta(0, [TokenRecord(104), TokenRecord(101)], "he")]
    assert s.events(0, out("hel", [104, 101, 108])) == [TokenDelta(0, [TokenRecord(108)], "l")]
    events = s.events(0, out("hell", [104, 101, 108, 108], {"type": "length", "length": 4}))
    assert events == [
        TokenDelta(0, [TokenRecord(108)], "l"),
        UsageReport(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=0),
        OutputFinished(0, pb.FINISH_REASON_LENGTH),
    ]


def test_an_incomplete_character_waits_for_the_next_chunk() -> None:
    s = stream(request())
    assert s.events(0, out("a\ufffd", [97, 200])) == [TokenDelta(0, [TokenRecord(97), TokenRecord(200)], "a")]
    assert s.events(0, out("aé", [97, 200, 201])) == [TokenDelta(0, [TokenRecord(201)], "é")]


def test_eos_stays_a_record_without_text() -> None:
    s = stream(request())
    events = s.events(0, out("hi", [104, 105, EOS], {"type": "stop", "matched": EOS}))
    assert events[0] == TokenDelta(0, [TokenRecord(104), TokenRecord(105), TokenRecord(EOS)], "hi")
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS))


def test_a_callers_stop_token_is_told_from_eos_and_dropped_unless_included() -> None:
    finish = {"type": "stop", "matched": 9}
    dropped = stream(request(stopping=Stopping(stop_token_ids=(9,)))).events(0, out("hi", [104, 105, 9], finish))
    assert dropped[0] == TokenDelta(0, [TokenRecord(104), TokenRecord(105)], "hi")
    assert dropped[1] == UsageReport(3, 3, 0), "usage counts the stop token SGLang generated"
    assert dropped[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(9))
    included = stream(request(stopping=Stopping(stop_token_ids=(9,), include_stop_in_output=True)))
    events = included.events(0, out("hi\t", [104, 105, 9], finish))
    assert events[0] == TokenDelta(0, [TokenRecord(104), TokenRecord(105), TokenRecord(9)], "hi\t")


def test_with_ignore_eos_the_callers_stop_tokens_are_watched_for() -> None:
    """SGLang ignores stop ids under ``ignore_eos``: the output ends at the first one past ``min_tokens``."""
    pieces = {104: "h", 105: "i", 9: "!", EOS: ""}

    def decode(ids: Any) -> str:
        return "".join(pieces[i] for i in ids)

    stopping = Stopping(ignore_eos=True, stop_token_ids=(9,), min_tokens=1)
    s = RequestStream(request(stopping=stopping), eos_token_ids=(EOS,), prompt_ids=PROMPT, decode=decode)
    assert s.events(0, out("!", [9]))[1:] == [TokenDelta(0, [TokenRecord(9)], "!")], "before min_tokens: not a stop"
    events = s.events(0, out("!hi!h", [9, 104, 105, 9, 104]))
    assert events == [
        TokenDelta(0, [TokenRecord(104), TokenRecord(105)], "hi"),
        UsageReport(3, 4, 0),
        OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(9)),
    ]
    assert s.finished(0)
    kept = Stopping(ignore_eos=True, stop_token_ids=(9,), include_stop_in_output=True)
    s = RequestStream(request(stopping=kept), eos_token_ids=(EOS,), prompt_ids=PROMPT, decode=decode)
    events = s.events(0, out("h!i", [104, 9, 105]))
    assert events[1] == TokenDelta(0, [TokenRecord(104), TokenRecord(9)], "h!")


def test_stop_strings_and_unknown_string_matches() -> None:
    s = stream(request(stopping=Stopping(stop_texts=("lo",))))
    events = s.events(0, out("hel", [104, 101, 108, 108, 111], {"type": "stop", "matched": "lo"}))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("lo"))
    assert events[0] == TokenDelta(0, [TokenRecord(t) for t in (104, 101, 108, 108, 111)], "hel")
    with pytest.raises(EngineFailure, match="NaN happened"):
        stream(request()).events(0, out("", [0], {"type": "stop", "matched": "NaN happened"}))


def test_a_grammar_that_terminates_reports_its_last_token() -> None:
    events = stream(request()).events(0, out("a", [97, EOS], {"type": "stop", "matched": [EOS]}))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS))


def test_aborts_cancel_and_aborts_with_a_status_fail() -> None:
    """An abort's dictionary has no prompt or cache counts (``_handle_abort_req``)."""
    s = stream(request())
    info = {"id": "x", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}, "completion_tokens": 1}
    events = s.events(0, {"text": "h", "output_ids": [104], "meta_info": info})
    assert events[-2] == UsageReport(prompt_tokens=3, completion_tokens=1, cached_prompt_tokens=0)
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_CANCELLED, message="Abort in waiting queue")
    bad = {"type": "abort", "message": "bad regex", "status_code": 400, "err_type": "BadRequestError"}
    with pytest.raises(EngineFailure) as failure:
        stream(request()).events(0, out("", [], bad))
    assert failure.value.code == pb.ERROR_CODE_INVALID_ARGUMENT


def test_abort_statuses() -> None:
    assert abort_failure(503, "full", decode=False).code == pb.ERROR_CODE_OVERLOADED
    assert abort_failure(500, "x", decode=True).code == pb.ERROR_CODE_KV_TRANSFER_FAILED
    assert abort_failure(500, "x", decode=False).code == pb.ERROR_CODE_INTERNAL
    decode = stream(request(kv_session=KvSession("s")))
    with pytest.raises(EngineFailure) as failure:
        decode.events(0, out("", [], {"type": "abort", "message": "KV transfer failed", "status_code": 500}))
    assert failure.value.code == pb.ERROR_CODE_KV_TRANSFER_FAILED and failure.value.retryable


def test_output_logprobs_with_top_n_candidates_ranks_and_texts() -> None:
    wanted = request(output_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=1)))
    s = stream(wanted)
    top = [[(-0.1, 104, "h"), (-2.0, 105, "i")], [(-0.3, 107, "k"), (-0.5, 101, "e")]]
    meta = {"output_token_logprobs": [(-0.1, 104, "h"), (-0.5, 101, "e")], "output_top_logprobs": top}
    (delta,) = s.events(0, out("he", [104, 101], **meta))
    assert delta == TokenDelta(
        0,
        [
            TokenRecord(104, "h", -0.1, 1, [Candidate(104, -0.1, "h", 1)]),
            TokenRecord(101, "e", -0.5, 2, [Candidate(107, -0.3, "k", 1)]),
        ],
        "he",
    )


def test_explicit_candidate_ids_come_in_request_order_without_ranks() -> None:
    selection = CandidateSelection(IDS, token_ids=(7, 5))
    by_id = [(-3.0, 5, "x"), (-4.0, 7, "y")]
    record = token_record((-0.2, 9, "z"), None, by_id, selection)
    assert record == TokenRecord(9, "z", -0.2, None, [Candidate(7, -4.0, "y"), Candidate(5, -3.0, "x")])
    every = token_record((-0.2, 9, "z"), [(-0.2, 9, "z"), (-1.0, 3, None)], None, CandidateSelection(ALL))
    assert every.rank == 1 and [c.token_id for c in every.candidates] == [9, 3]
    assert every.candidates[1].token == ""


def test_prompt_tokens_once_from_the_start_the_first_without_a_logprob() -> None:
    wanted = request(prompt_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=1)), prompt_logprob_start=0)
    meta = {
        "input_token_logprobs": [(None, 10, "a"), (-1.5, 11, "b"), (-0.5, 12, "c")],
        "input_top_logprobs": [None, [(-0.2, 3, "q")], [(-0.5, 12, "c")]],
        "output_token_logprobs": [(-0.1, 104, "h")],
    }
    s = stream(wanted)
    events = s.events(0, out("h", [104], **meta))
    assert events[0] == PromptTokens(
        [
            TokenRecord(10, "a"),
            TokenRecord(11, "b", -1.5, None, [Candidate(3, -0.2, "q", 1)]),
            TokenRecord(12, "c", -0.5, 1, [Candidate(12, -0.5, "c", 1)]),
        ]
    )
    assert not any(isinstance(e, PromptTokens) for e in s.events(0, out("hh", [104, 104], **meta)))


def test_prompt_ids_sglang_clips_to_zero_are_the_prompt_s_own() -> None:
    """SGLang reports prompt ids from ``vocab_size - 1`` on as 0 (``logprob_result_processor.py``,
    a guard for image pad hashes): the records carry the ids the engine was given."""
    last = 511
    wanted = GenerationRequest(
        request_id="r", model="m", prompt_token_ids=[10, last], prompt_logprobs=LogprobRequest(), prompt_logprob_start=0
    )
    meta = {"input_token_logprobs": [(None, 10, "a"), (-2.0, 0, "<unk>")], "output_token_logprobs": [(-0.1, 104, "h")]}
    made = RequestStream(wanted, eos_token_ids=(EOS,), prompt_ids=[10, last], decode=lambda ids: f"<{ids[0]}>")
    (prompt,) = [event for event in made.events(0, out("h", [104], **meta)) if isinstance(event, PromptTokens)]
    assert prompt == PromptTokens([TokenRecord(10, "a"), TokenRecord(last, f"<{last}>", -2.0)])


def test_a_later_start_drops_sglangs_first_entry() -> None:
    """For start 2 the driver asked SGLang to start at 1: its entry for position 1 has no logprob."""
    wanted = request(prompt_logprobs=LogprobRequest(), prompt_logprob_start=2)
    meta = {"input_token_logprobs": [(None, 11, "b"), (-0.5, 12, "c")], "output_token_logprobs": [(-0.1, 104, "h")]}
    events = stream(wanted).events(0, out("h", [104], **meta))
    assert events[0] == PromptTokens([TokenRecord(12, "c", -0.5)])


def test_several_outputs_share_cumulative_usage() -> None:
    s = stream(request(sampling=Sampling(num_sequences=2)), reasoning=True)
    s.events(1, out("ab", [97, 98], cached_tokens=0, reasoning_tokens=1))
    events = s.events(0, out("c", [99], {"type": "length", "length": 1}, cached_tokens=2, reasoning_tokens=1))
    assert events[1] == UsageReport(prompt_tokens=3, completion_tokens=3, cached_prompt_tokens=0, reasoning_tokens=2)
    uncounted = stream(request(), reasoning=True)
    (*_, usage, _finished) = uncounted.events(0, out("c", [99], {"type": "length", "length": 1}, reasoning_tokens=0))
    assert usage.reasoning_tokens is None, "SGLang reports 0 where it did not count"


def test_unknown_finish_types_fail() -> None:
    with pytest.raises(EngineFailure, match="finished output 0"):
        stream(request()).events(0, out("", [], {"type": "mystery"}))
