"""vLLM delta outputs → generation events."""

from __future__ import annotations

import pytest
from openengine_backends.vllm.outputs import RequestStream, logprob_rows, prompt_records
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    Sampling,
    StopMatch,
    Stopping,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

from .shapes import CompletionOutput, RequestOutput, as_dicts, flat

TOP_N, IDS = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS
EOS = 1
PROMPT = [0, 10, 11]


def request(**fields: object) -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=PROMPT, **fields)  # type: ignore[arg-type]


def output(*completions: CompletionOutput, finished: bool = False, **fields: object) -> RequestOutput:
    fields.setdefault("prompt_logprobs", None)
    return RequestOutput("r", None, PROMPT, outputs=list(completions), finished=finished, **fields)  # type: ignore[arg-type]


def test_deltas_without_logprobs_are_ids_and_text() -> None:
    stream = RequestStream(request(), eos_token_ids=(EOS,))
    assert stream.events(output(CompletionOutput(0, " a", [5, 6]))) == [
        TokenDelta(0, [TokenRecord(5), TokenRecord(6)], " a"),
        UsageReport(prompt_tokens=3, completion_tokens=2, cached_prompt_tokens=0),  # so an abort counts the prompt
    ]
    assert stream.events(output(CompletionOutput(0, "", [9]))) == [TokenDelta(0, [TokenRecord(9)], "")], "once only"
    events = stream.events(output(CompletionOutput(0, "b", [7], finish_reason="length"), finished=True))
    assert events == [
        TokenDelta(0, [TokenRecord(7)], "b"),
        UsageReport(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=0),
        OutputFinished(0, pb.FINISH_REASON_LENGTH),
    ]


def test_eos_is_told_apart_from_a_callers_stop_token() -> None:
    stream = RequestStream(request(stopping=Stopping(stop_token_ids=(9,))), eos_token_ids=(EOS,))
    eos = stream.events(output(CompletionOutput(0, "", [EOS], finish_reason="stop"), finished=True))
    assert eos[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(EOS))
    assert eos[0] == TokenDelta(0, [TokenRecord(EOS)], "")
    stream = RequestStream(request(stopping=Stopping(stop_token_ids=(9,))), eos_token_ids=(EOS,))
    stop = stream.events(output(CompletionOutput(0, "x", [4, 9], finish_reason="stop", stop_reason=9), finished=True))
    assert stop[0] == TokenDelta(0, [TokenRecord(4)], "x"), "vLLM leaves the stop token in the ids; it is dropped"
    assert stop[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(9))
    assert stop[1] == UsageReport(3, 2, 0), "usage counts every generated token"


def test_a_stop_token_stays_when_the_caller_includes_it() -> None:
    stopping = Stopping(stop_token_ids=(9,), include_stop_in_output=True)
    stream = RequestStream(request(stopping=stopping), eos_token_ids=(EOS,))
    events = stream.events(output(CompletionOutput(0, "x", [4, 9], finish_reason="stop", stop_reason=9), finished=True))
    assert events[0] == TokenDelta(0, [TokenRecord(4), TokenRecord(9)], "x")


def test_a_generation_config_eos_reported_as_a_stop_token_is_eos() -> None:
    stream = RequestStream(request(), eos_token_ids=(EOS, 7))
    events = stream.events(output(CompletionOutput(0, "", [7], finish_reason="stop", stop_reason=7), finished=True))
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(7))
    assert events[0] == TokenDelta(0, [TokenRecord(7)], "")


def test_stop_strings_come_from_vllms_stop_reason() -> None:
    stream = RequestStream(request(stopping=Stopping(stop_texts=("ab",))), eos_token_ids=(EOS,))
    events = stream.events(
        output(CompletionOutput(0, "x", [4, 5], finish_reason="stop", stop_reason="ab"), finished=True)
    )
    assert events[-1] == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.text("ab"))


@pytest.mark.parametrize("form", [flat, as_dicts])
def test_top_n_logprobs_one_record_per_token_with_true_ranks(form: object) -> None:
    wanted = request(output_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=2)))
    rows = [
        [(5, -0.5, 1, "a"), (5, -0.5, 1, "a"), (6, -1.5, 2, "b")],
        [(8, -3.0, 4, "c"), (2, -0.2, 1, "d"), (3, -0.9, 2, "e")],
    ]
    stream = RequestStream(wanted, eos_token_ids=(EOS,))
    delta, _usage = stream.events(output(CompletionOutput(0, "ac", [5, 8], logprobs=form(*rows))))  # type: ignore[operator]
    assert delta == TokenDelta(
        0,
        [
            TokenRecord(5, "a", -0.5, 1, [Candidate(5, -0.5, "a", 1), Candidate(6, -1.5, "b", 2)]),
            TokenRecord(8, "c", -3.0, 4, [Candidate(2, -0.2, "d", 1), Candidate(3, -0.9, "e", 2)]),
        ],
        "ac",
    )


def test_explicit_candidate_ids_carry_no_rank_and_keep_request_order() -> None:
    """The driver asks for flat logprobs: vLLM's dict form would overwrite the chosen token's
    rank with a candidate position when the chosen id is also requested."""
    wanted = request(output_logprobs=LogprobRequest(CandidateSelection(IDS, token_ids=(6, 5))))
    rows = [[(5, -0.5, 1, "a"), (6, -1.5, 1, "b"), (5, -0.5, 2, "a")]]
    stream = RequestStream(wanted, eos_token_ids=(EOS,))
    delta, _usage = stream.events(output(CompletionOutput(0, "a", [5], logprobs=flat(*rows))))
    assert delta.tokens == [TokenRecord(5, "a", -0.5, 1, [Candidate(6, -1.5, "b"), Candidate(5, -0.5, "a")])]


def test_prompt_tokens_once_first_without_logprob_from_the_start_position() -> None:
    wanted = request(prompt_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=1)))
    prompt = flat(None, [(10, -4.0, 7, "x"), (3, -0.1, 1, "y")], [(11, -0.3, 1, "z"), (11, -0.3, 1, "z")])
    stream = RequestStream(wanted, eos_token_ids=(EOS,), token_text={0: "<s>"}.__getitem__)
    events = stream.events(output(CompletionOutput(0, "", [5]), prompt_logprobs=prompt))
    assert events[0] == PromptTokens(
        [
            TokenRecord(0, "<s>"),  # vLLM decodes no text for the unscored first token: the driver does
            TokenRecord(10, "x", -4.0, 7, [Candidate(3, -0.1, "y", 1)]),
            TokenRecord(11, "z", -0.3, 1, [Candidate(11, -0.3, "z", 1)]),
        ]
    )
    assert not any(isinstance(e, PromptTokens) for e in stream.events(output(CompletionOutput(0, "", [6]))))
    later = prompt_records(PROMPT, prompt, start=2)
    assert [r.token_id for r in later] == [11] and later[0].logprob == -0.3


def test_prompt_candidate_ids_from_vllm_rows() -> None:
    prompt = flat(None, [(10, -4.0, 7, "x")], [(11, -0.3, 1, "z")])
    rows = [[-2.0, -5.0], [-1.0, -6.0]]
    records = prompt_records(PROMPT, prompt, start=1, explicit_ids=(3, 4), explicit_scores=rows)
    assert records[0].candidates == [Candidate(3, -2.0), Candidate(4, -5.0)]
    assert records[1].candidates == [Candidate(3, -1.0), Candidate(4, -6.0)]


def test_several_outputs_usage_and_cached_tokens() -> None:
    stream = RequestStream(request(sampling=Sampling(num_sequences=2)), eos_token_ids=(EOS,))
    stream.events(output(CompletionOutput(1, "a", [5, 6]), CompletionOutput(0, "b", [7])))
    events = stream.events(output(CompletionOutput(0, "c", [8], finish_reason="length"), num_cached_tokens=2))
    assert events[1] == UsageReport(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=2)
    assert events[2] == OutputFinished(0, pb.FINISH_REASON_LENGTH)


def test_engine_abort_cancels_and_error_fails() -> None:
    stream = RequestStream(request(), eos_token_ids=(EOS,))
    events = stream.events(output(CompletionOutput(0, "", [], finish_reason="abort"), finished=True))
    assert events[-1].reason == pb.FINISH_REASON_CANCELLED  # type: ignore[union-attr]
    with pytest.raises(EngineFailure) as failure:
        stream.events(output(CompletionOutput(0, "", [], finish_reason="error"), finished=True))
    assert failure.value.code == pb.ERROR_CODE_INTERNAL and failure.value.retryable
    decode = RequestStream(request(kv_session=KvSession("s")), eos_token_ids=(EOS,))
    with pytest.raises(EngineFailure) as failure:
        decode.events(output(CompletionOutput(0, "", [], finish_reason="error"), finished=True))
    assert failure.value.code == pb.ERROR_CODE_KV_TRANSFER_FAILED


def test_a_guided_output_failing_before_its_first_token_is_its_grammar() -> None:
    """vLLM fails a request whose grammar it accepted but cannot compile: not worth a retry."""
    guided = request(guidance=Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, "root ::= "))
    with pytest.raises(EngineFailure) as failure:
        RequestStream(guided, eos_token_ids=(EOS,)).events(
            output(CompletionOutput(0, "", [], finish_reason="error"), finished=True)
        )
    assert failure.value.code == pb.ERROR_CODE_INVALID_ARGUMENT and not failure.value.retryable
    assert "could not compile" in failure.value.message
    started = RequestStream(guided, eos_token_ids=(EOS,))
    started.events(output(CompletionOutput(0, "a", [5])))
    with pytest.raises(EngineFailure) as failure:  # after a token the grammar compiled: the engine failed
        started.events(output(CompletionOutput(0, "", [], finish_reason="error"), finished=True))
    assert failure.value.code == pb.ERROR_CODE_INTERNAL and failure.value.retryable


def test_a_guided_token_the_grammar_rejected_under_min_tokens_is_the_request_s_conflict() -> None:
    """Where the guide allows only tokens ``min_tokens`` still bans (a stop token), vLLM samples a token
    outside the grammar and fails the request: retrying it fails again. The rejected token is not counted."""
    guided = request(
        guidance=Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("no",)),
        stopping=Stopping(max_tokens=10, min_tokens=5, stop_token_ids=(81,)),
    )
    stream = RequestStream(guided, eos_token_ids=(EOS,))
    stream.events(output(CompletionOutput(0, "n", [80])))
    with pytest.raises(EngineFailure) as failure:
        stream.events(output(CompletionOutput(0, "", [0], finish_reason="error"), finished=True))
    assert failure.value.code == pb.ERROR_CODE_INVALID_ARGUMENT and not failure.value.retryable
    assert "min_tokens" in failure.value.message
    assert stream.usage(output()).completion_tokens == 1


def test_a_guided_decode_failing_before_its_first_token_is_its_kv_transfer() -> None:
    """vLLM fails a decode whose KV load failed before any token (``Scheduler``): not the grammar."""
    guided = request(guidance=Guidance(pb.GUIDED_DECODING_MODE_REGEX, "a+"), kv_session=KvSession("s"))
    with pytest.raises(EngineFailure) as failure:
        RequestStream(guided, eos_token_ids=(EOS,)).events(
            output(CompletionOutput(0, "", [], finish_reason="error"), finished=True)
        )
    assert failure.value.code == pb.ERROR_CODE_KV_TRANSFER_FAILED and failure.value.retryable


def test_prefill_ends_with_its_final_transfer_params_as_the_session() -> None:
    params = {"remote_block_ids": [3, 4], "remote_port": 5600, "remote_host": "p0", "do_remote_prefill": True}
    stream = RequestStream(request(), eos_token_ids=(EOS,), prefill=True, transfer_backend="NixlConnector")
    assert stream.events(output(CompletionOutput(0, "", [5]))) == []
    events = stream.events(
        output(CompletionOutput(0, "", [], finish_reason="length"), finished=True, kv_transfer_params=params)
    )
    assert events == [
        UsageReport(3, 1, 0),
        PrefillDone(KvSession("r", "NixlConnector", (), 0, params)),
    ]


def test_logprob_rows_read_both_vllm_shapes_alike() -> None:
    rows = [None, [(5, -0.5, 1, "a"), (6, -1.5, 2, None)]]
    assert logprob_rows(flat(*rows)) == logprob_rows(as_dicts(*rows)) == [[], [(5, -0.5, 1, "a"), (6, -1.5, 2, None)]]
