"""The remote's answers → SPI events and gateway errors: pure functions, no I/O.

A remote ``GenerateResponse`` becomes the events the front's encoder turns back into the same
message (usage first, since the remote sends it on the final message and the encoder needs it
before the final event). A remote ``EngineError`` becomes an ``EngineFailure`` with the same
code, retryability, delay and details; a remote non-OK status becomes the same status, before
acceptance, or a retryable failure once the stream was accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.json_format import MessageToDict
from openengine_gateway import pb
from openengine_gateway.errors import (
    REQUEST_ERRORS,
    EngineFailure,
    RequestError,
    Unavailable,
)
from openengine_gateway.spi import (
    Candidate,
    GenerationEvent,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
)
from openengine_gateway.spi.wire import kv_session


def token_record(info: pb.TokenInfo) -> TokenRecord:
    """One token with its logprob, rank and candidates; absent values stay absent."""
    return TokenRecord(
        token_id=info.token_id,
        token=info.token,
        logprob=info.logprob if info.HasField("logprob") else None,
        rank=info.rank if info.HasField("rank") else None,
        candidates=[
            Candidate(c.token_id, c.logprob, c.token, c.rank if c.HasField("rank") else None) for c in info.candidates
        ],
    )


def _records(tokens: Sequence[pb.TokenInfo]) -> list[TokenRecord]:
    return [token_record(info) for info in tokens]


def stop_match(match: pb.StopMatch) -> StopMatch | None:
    """What ended an output with STOP, or None when the message names nothing."""
    kind = match.WhichOneof("match")
    if kind == "stop_token_id":
        return StopMatch.token(match.stop_token_id)
    if kind == "stop_text":
        return StopMatch.text(match.stop_text)
    if kind == "eos_token_id":
        return StopMatch.eos(match.eos_token_id)
    return None


def engine_failure(error: pb.EngineError) -> EngineFailure:
    """The remote's terminal error, unchanged."""
    return EngineFailure(
        error.code,
        error.message,
        retryable=error.retryable,
        retry_after_ms=error.retry_after_ms if error.HasField("retry_after_ms") else None,
        details=MessageToDict(error.details) if error.HasField("details") else None,
    )


def generation_events(response: pb.GenerateResponse) -> tuple[list[GenerationEvent], EngineFailure | None]:
    """The events of one remote response, and the failure it ends with, if any."""
    events: list[GenerationEvent] = []
    if response.HasField("usage"):
        usage = response.usage
        events.append(
            UsageReport(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_prompt_tokens if usage.HasField("cached_prompt_tokens") else None,
                usage.reasoning_tokens if usage.HasField("reasoning_tokens") else None,
            )
        )
    kind = response.WhichOneof("event")
    if kind == "token":
        token = response.token
        events.append(TokenDelta(token.output_index, _records(token.tokens), token.text))
    elif kind == "finished":
        finished = response.finished
        match = stop_match(finished.stop_match) if finished.HasField("stop_match") else None
        events.append(OutputFinished(finished.output_index, finished.reason, match, finished.message))
    elif kind == "prompt":
        events.append(PromptTokens(_records(response.prompt.tokens)))
    elif kind == "prefill_ready":
        events.append(PrefillDone(kv_session(response.prefill_ready.kv_session)))
    elif kind == "error":
        return events, engine_failure(response.error)
    return events, None


def rejection(status: str, details: str, retry_after_ms: int | None = None) -> RequestError:
    """The front's pre-acceptance error for the remote's non-OK status named ``status``.

    A status the gateway has no class for (UNKNOWN, DEADLINE_EXCEEDED, ABORTED, DATA_LOSS)
    means the remote could not be used: UNAVAILABLE, so the caller may retry elsewhere.
    """
    kind = REQUEST_ERRORS.get(status)
    if kind is None:
        return Unavailable(f"the remote engine answered {status}: {details}", retry_after_ms=retry_after_ms)
    return kind(details, retry_after_ms=retry_after_ms)


def stream_failure(status: str, details: str) -> EngineFailure:
    """The failure of an accepted remote stream that ended with a non-OK status (no EngineError)."""
    if status == "CANCELLED":
        return EngineFailure(pb.ERROR_CODE_CANCELLED, f"the remote engine cancelled the request: {details}")
    return EngineFailure(
        pb.ERROR_CODE_INTERNAL, f"the remote engine's stream failed with {status}: {details}", retryable=True
    )


__all__ = [
    "engine_failure",
    "generation_events",
    "rejection",
    "stop_match",
    "stream_failure",
    "token_record",
]
