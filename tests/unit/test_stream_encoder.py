"""``contract.stream.GenerateEncoder``: the stream invariants every driver gets for free."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.stream import ContractViolation, GenerateEncoder, token_info
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    KvSession,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

STOP = pb.FINISH_REASON_STOP
LENGTH = pb.FINISH_REASON_LENGTH


def encoder(outputs: int = 1, *, prefill: bool = False, prompt_logprobs: bool = False) -> GenerateEncoder:
    return GenerateEncoder("r", num_outputs=outputs, prefill=prefill, prompt_logprobs=prompt_logprobs)


def delta(index: int, *ids: int, text: str = "") -> TokenDelta:
    return TokenDelta(index, [TokenRecord(i) for i in ids], text)


def encode_all(enc: GenerateEncoder, *events: object) -> list[pb.GenerateResponse]:
    messages = [enc.encode(e) for e in events]  # type: ignore[arg-type]
    return [m for m in messages if m is not None]


def test_output_index_is_present_even_for_zero() -> None:
    enc = encoder()
    token, finished = encode_all(
        enc, delta(0, 5, text="a"), UsageReport(3, 1), OutputFinished(0, STOP, StopMatch.eos(2))
    )
    assert token.request_id == finished.request_id == "r"
    assert token.token.HasField("output_index") and token.token.output_index == 0
    assert finished.finished.HasField("output_index") and finished.finished.output_index == 0
    assert [t.token_id for t in token.token.tokens] == [5] and token.token.text == "a"


def test_usage_only_on_the_final_response() -> None:
    enc = encoder(2)
    messages = encode_all(
        enc,
        delta(0, 1),
        UsageReport(4, 1),
        delta(1, 2, 3),
        OutputFinished(1, LENGTH),
        UsageReport(4, 4, cached_prompt_tokens=2, reasoning_tokens=1),
        delta(0, 4),
        OutputFinished(0, STOP, StopMatch.token(9)),
    )
    assert [m.HasField("usage") for m in messages] == [False, False, False, False, True]
    assert enc.done
    usage = messages[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4, 4, 8)
    assert usage.cached_prompt_tokens == 2 and usage.reasoning_tokens == 1


def test_usage_subsets_are_clamped_and_absent_stays_absent() -> None:
    enc = encoder()
    (final,) = encode_all(enc, UsageReport(3, 2, cached_prompt_tokens=9, reasoning_tokens=5), OutputFinished(0, LENGTH))
    assert final.usage.cached_prompt_tokens == 3  # a subset of prompt_tokens
    assert final.usage.reasoning_tokens == 2  # a subset of completion_tokens
    enc = encoder()
    (final,) = encode_all(enc, UsageReport(3, 0), OutputFinished(0, LENGTH))
    assert not final.usage.HasField("cached_prompt_tokens") and not final.usage.HasField("reasoning_tokens")
    assert final.usage.prompt_tokens == 3 and final.usage.total_tokens == 3


def test_final_event_without_usage_is_a_violation() -> None:
    enc = encoder()
    with pytest.raises(ContractViolation, match="usage"):
        enc.encode(OutputFinished(0, LENGTH))


def test_exactly_one_finish_per_output() -> None:
    enc = encoder(2)
    encode_all(enc, UsageReport(1, 1), OutputFinished(0, LENGTH))
    with pytest.raises(ContractViolation, match="already finished"):
        enc.encode(OutputFinished(0, LENGTH))
    with pytest.raises(ContractViolation, match="already finished"):
        enc.encode(delta(0, 1))
    assert enc.unfinished_outputs == [1]
    assert not enc.done


@pytest.mark.parametrize("index", [-1, 2])
def test_output_index_must_be_in_range(index: int) -> None:
    with pytest.raises(ContractViolation, match=r"outside 0\.\.1"):
        encoder(2).encode(delta(index, 1))


def test_stop_needs_a_stop_match() -> None:
    enc = encoder()
    enc.encode(UsageReport(1, 1))
    with pytest.raises(ContractViolation, match="stop_match"):
        enc.encode(OutputFinished(0, STOP))
    with pytest.raises(ContractViolation, match="stop_match"):
        enc.encode(OutputFinished(0, STOP, StopMatch()))
    assert not enc.done


@pytest.mark.parametrize(
    ("stop", "field", "value"),
    [
        (StopMatch.token(7), "stop_token_id", 7),
        (StopMatch.text("\n\n"), "stop_text", "\n\n"),
        (StopMatch.eos(0), "eos_token_id", 0),
    ],
)
def test_stop_match_kinds(stop: StopMatch, field: str, value: object) -> None:
    (final,) = encode_all(encoder(), UsageReport(1, 1), OutputFinished(0, STOP, stop, message="m"))
    match = final.finished.stop_match
    assert match.WhichOneof("match") == field and getattr(match, field) == value
    assert final.finished.reason == STOP and final.finished.message == "m"


def test_length_finish_has_no_stop_match() -> None:
    (final,) = encode_all(encoder(), UsageReport(1, 1), OutputFinished(0, LENGTH, StopMatch.eos(1)))
    assert not final.finished.HasField("stop_match")


@pytest.mark.parametrize("reason", [pb.FINISH_REASON_UNSPECIFIED, 17])
def test_unknown_finish_reason_is_a_violation(reason: int) -> None:
    enc = encoder()
    enc.encode(UsageReport(1, 1))
    with pytest.raises(ContractViolation, match="finish reason"):
        enc.encode(OutputFinished(0, reason))  # type: ignore[arg-type]


def test_nothing_after_the_terminal_response() -> None:
    enc = encoder()
    encode_all(enc, UsageReport(1, 1), OutputFinished(0, LENGTH))
    assert enc.done
    for event in (delta(0, 1), UsageReport(1, 1), OutputFinished(0, LENGTH), PromptTokens([])):
        with pytest.raises(ContractViolation, match="after the terminal response"):
            enc.encode(event)
    with pytest.raises(ContractViolation):
        enc.error(EngineFailure(pb.ERROR_CODE_INTERNAL, "late"))


def test_nothing_after_an_error() -> None:
    """EngineError is terminal for every output: no finish, token or cancellation follows it."""
    enc = encoder(2)
    encode_all(enc, delta(0, 1), UsageReport(2, 1))
    error = enc.error(EngineFailure(pb.ERROR_CODE_KV_TRANSFER_FAILED, "lost", retryable=True, retry_after_ms=5))
    assert error.error.code == pb.ERROR_CODE_KV_TRANSFER_FAILED
    assert error.error.retry_after_ms == 5
    assert error.usage.completion_tokens == 1 and error.usage.prompt_tokens == 2
    assert enc.done
    with pytest.raises(ContractViolation):
        enc.encode(OutputFinished(1, LENGTH))
    assert enc.cancelled("late abort") == []


def test_error_without_usage_counts_what_was_sent() -> None:
    enc = encoder()
    encode_all(enc, delta(0, 1, 2), delta(0, 3))
    final = enc.error(EngineFailure(pb.ERROR_CODE_INTERNAL, "boom"))
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (0, 3, 3)


def test_empty_delta_produces_no_message() -> None:
    enc = encoder()
    assert enc.encode(TokenDelta(0, [])) is None
    assert enc.encode(TokenDelta(0, [], "x")) is not None  # text alone is a message


def test_prompt_output_at_most_once_and_only_when_requested() -> None:
    with pytest.raises(ContractViolation, match="without a prompt-logprobs request"):
        encoder().encode(PromptTokens([TokenRecord(1)]))
    enc = encoder(prompt_logprobs=True)
    first = enc.encode(PromptTokens([TokenRecord(1, "a"), TokenRecord(2, "b", -0.5, 1)]))
    assert first is not None
    tokens = first.prompt.tokens
    assert not tokens[0].HasField("logprob") and not tokens[0].HasField("rank") and not tokens[0].candidates
    assert tokens[1].logprob == -0.5 and tokens[1].rank == 1
    with pytest.raises(ContractViolation, match="twice"):
        enc.encode(PromptTokens([]))


def test_token_info_keeps_presence_and_alignment() -> None:
    record = TokenRecord(3, "c", logprob=0.0, rank=1, candidates=[Candidate(3, 0.0, "c", 1), Candidate(4, -1.0, "d")])
    info = token_info(record)
    assert info.HasField("logprob") and info.logprob == 0.0 and info.rank == 1
    assert [(c.token_id, c.logprob, c.token) for c in info.candidates] == [(3, 0.0, "c"), (4, -1.0, "d")]
    assert info.candidates[0].HasField("rank") and not info.candidates[1].HasField("rank")
    bare = token_info(TokenRecord(0))
    assert not bare.HasField("logprob") and not bare.HasField("rank")


def test_prefill_path() -> None:
    enc = encoder(prefill=True, prompt_logprobs=True)
    session = KvSession("s1", "nixl", attributes={"port": 5})
    messages = encode_all(
        enc, PromptTokens([TokenRecord(1)]), UsageReport(5, 0, cached_prompt_tokens=1), PrefillDone(session)
    )
    assert [m.WhichOneof("event") for m in messages] == ["prompt", "prefill_ready"]
    final = messages[-1]
    assert final.prefill_ready.kv_session.session_id == "s1"
    assert final.prefill_ready.kv_session.attributes_struct["port"] == 5
    assert final.usage.prompt_tokens == 5 and final.usage.cached_prompt_tokens == 1
    assert enc.done


def test_prefill_rejects_output_events() -> None:
    enc = encoder(prefill=True)
    with pytest.raises(ContractViolation, match="prefill"):
        enc.encode(delta(0, 1))
    with pytest.raises(ContractViolation, match="prefill"):
        enc.encode(OutputFinished(0, LENGTH))
    enc.encode(UsageReport(1, 0))
    with pytest.raises(ContractViolation, match="session id"):
        enc.encode(PrefillDone(KvSession("")))


def test_prefill_ready_needs_usage_and_a_prefill() -> None:
    with pytest.raises(ContractViolation, match="usage"):
        encoder(prefill=True).encode(PrefillDone(KvSession("s")))
    with pytest.raises(ContractViolation, match="not a prefill"):
        encoder().encode(PrefillDone(KvSession("s")))


def test_cancelled_finishes_open_outputs_with_usage_on_the_last() -> None:
    enc = encoder(3)
    encode_all(enc, delta(1, 1), UsageReport(2, 1), OutputFinished(1, LENGTH))
    messages = enc.cancelled("aborted by Abort")
    assert [(m.finished.output_index, m.finished.reason, m.finished.message) for m in messages] == [
        (0, pb.FINISH_REASON_CANCELLED, "aborted by Abort"),
        (2, pb.FINISH_REASON_CANCELLED, "aborted by Abort"),
    ]
    assert [m.HasField("usage") for m in messages] == [False, True]
    assert messages[-1].usage.completion_tokens == 1
    assert enc.done and enc.unfinished_outputs == []


def test_cancelled_without_usage_report() -> None:
    (message,) = encoder().cancelled("x")
    assert message.usage.prompt_tokens == 0 and message.usage.completion_tokens == 0


def test_cancelled_prefill_is_a_cancelled_error() -> None:
    (message,) = encoder(prefill=True).cancelled("drain")
    assert message.error.code == pb.ERROR_CODE_CANCELLED
    assert not message.error.retryable
    assert message.HasField("usage")


def test_unknown_event_is_a_violation() -> None:
    with pytest.raises(ContractViolation, match="unknown generation event"):
        encoder().encode("token")  # type: ignore[arg-type]
