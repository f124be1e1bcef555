"""``remote.responses``: what the remote sends becomes the events that re-encode to the same messages."""

from __future__ import annotations

import pytest
from openengine_backends.remote.responses import engine_failure, generation_events, rejection, stream_failure
from openengine_gateway import pb
from openengine_gateway.contract.stream import GenerateEncoder
from openengine_gateway.errors import (
    AlreadyExists,
    EngineFailure,
    InvalidArgument,
    RequestError,
    ResourceExhausted,
    Unavailable,
)
from openengine_gateway.spi import (
    Candidate,
    GenerationEvent,
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


def encode(events: list[GenerationEvent], *, outputs: int = 1, prefill: bool = False) -> list[pb.GenerateResponse]:
    encoder = GenerateEncoder("r", num_outputs=outputs, prefill=prefill, prompt_logprobs=True)
    return [m for m in map(encoder.encode, events) if m is not None]


def relayed(messages: list[pb.GenerateResponse]) -> list[GenerationEvent]:
    events: list[GenerationEvent] = []
    for message in messages:
        batch, failure = generation_events(message)
        assert failure is None
        events.extend(batch)
    return events


SCRIPTS: dict[str, tuple[list[GenerationEvent], int, bool]] = {
    "two outputs with every token field": (
        [
            PromptTokens([TokenRecord(1, "a"), TokenRecord(2, "b", -0.5, 3, [Candidate(2, -0.5, "b", 3)])]),
            TokenDelta(0, [TokenRecord(7, "x", -0.25, 1, [Candidate(7, -0.25, "x", 1), Candidate(8, -2.0, "y")])], "x"),
            TokenDelta(1, [TokenRecord(9, "z")], "z"),
            OutputFinished(1, pb.FINISH_REASON_LENGTH),
            UsageReport(2, 2, cached_prompt_tokens=1, reasoning_tokens=0),
            OutputFinished(0, STOP, StopMatch.text("."), "matched"),
        ],
        2,
        False,
    ),
    "eos and stop token": (
        [UsageReport(1, 0), OutputFinished(0, STOP, StopMatch.eos(2))],
        1,
        False,
    ),
    "prefill": (
        [UsageReport(4, 0), PrefillDone(KvSession("s", "tcp", dp_rank=1, attributes={"port": 5.0}))],
        1,
        True,
    ),
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_relayed_events_re_encode_to_the_same_messages(script: tuple[list[GenerationEvent], int, bool]) -> None:
    events, outputs, prefill = script
    messages = encode(events, outputs=outputs, prefill=prefill)
    assert encode(relayed(messages), outputs=outputs, prefill=prefill) == messages


def test_usage_comes_before_the_final_event() -> None:
    final = pb.GenerateResponse(
        finished=pb.GenerationFinished(output_index=0, reason=STOP, stop_match=pb.StopMatch(stop_token_id=4)),
        usage=pb.Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4),
    )
    events, failure = generation_events(final)
    assert failure is None
    assert events == [UsageReport(3, 1), OutputFinished(0, STOP, StopMatch.token(4))]


def test_remote_engine_error_is_the_same_failure() -> None:
    error = pb.EngineError(code=pb.ERROR_CODE_KV_TRANSFER_FAILED, message="lost", retryable=True, retry_after_ms=0)
    error.details.update({"session": "s1", "attempts": 2})
    events, failure = generation_events(pb.GenerateResponse(error=error, usage=pb.Usage(prompt_tokens=1)))
    assert events == [UsageReport(1, 0)] and failure is not None
    assert failure.to_proto() == error  # code, message, retryability, the explicit zero delay and details
    plain = engine_failure(pb.EngineError(code=pb.ERROR_CODE_INTERNAL, message="bug"))
    assert plain.to_proto() == pb.EngineError(code=pb.ERROR_CODE_INTERNAL, message="bug")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("INVALID_ARGUMENT", InvalidArgument),
        ("ALREADY_EXISTS", AlreadyExists),
        ("RESOURCE_EXHAUSTED", ResourceExhausted),
        ("UNAVAILABLE", Unavailable),
        ("DEADLINE_EXCEEDED", Unavailable),
        ("UNKNOWN", Unavailable),
    ],
)
def test_remote_statuses_are_the_same_statuses(status: str, kind: type[RequestError]) -> None:
    error = rejection(status, "why", 25)
    assert type(error) is kind and "why" in error.message and error.retry_after_ms == 25


def test_a_failed_accepted_stream_is_a_retryable_failure() -> None:
    failure = stream_failure("UNAVAILABLE", "connection reset")
    assert isinstance(failure, EngineFailure)
    assert failure.code == pb.ERROR_CODE_INTERNAL and failure.retryable and "connection reset" in failure.message
    assert stream_failure("CANCELLED", "x").code == pb.ERROR_CODE_CANCELLED
