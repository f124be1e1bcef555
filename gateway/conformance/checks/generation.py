"""Generation stream invariants, request validation and role compatibility."""

from __future__ import annotations

import grpc

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import Stream
from .abort import still_running

SECTION = "Generation API"
ROLES = "Core identity and roles"
MODELS = "Model and capacity metadata"


def _sequences(target: Target, wanted: int = 2) -> int:
    """``wanted`` outputs, or fewer when the model advertises a lower maximum."""
    generation = target.model_info.generation
    if generation.HasField("max_num_sequences"):
        return min(wanted, generation.max_num_sequences)
    return wanted


async def _several(target: Target, max_tokens: int = 4) -> tuple[Stream, int]:
    """A successful stream with several outputs (one when the model allows no more)."""
    target.require_generation()
    count = _sequences(target)
    request = target.prompt(max_tokens=max_tokens, ignore_eos=True, num_sequences=count, temperature=1.0)
    return (await target.run(request)).succeeded(), count


@rule(
    "generate.output-index-present",
    SECTION,
    "TokenOutput and GenerationFinished are output-scoped and must carry output_index, including index zero.",
)
async def output_index_present(target: Target) -> None:
    stream, _ = await _several(target)
    for message in stream.messages:
        kind = message.WhichOneof("event")
        if kind in ("token", "finished") and not getattr(message, kind).HasField("output_index"):
            raise CheckFailed(f"a {kind} event has no output_index")


@rule(
    "generate.output-index-range",
    SECTION,
    "An index is stable for the request and ranges from 0 through num_sequences - 1.",
)
async def output_index_range(target: Target) -> None:
    stream, count = await _several(target)
    seen = {m.token.output_index for m in stream.events("token")} | {
        m.finished.output_index for m in stream.events("finished")
    }
    if not seen <= set(range(count)):
        raise CheckFailed(f"output indexes {sorted(seen)} fall outside 0..{count - 1}")
    if {m.finished.output_index for m in stream.events("finished")} != set(range(count)):
        raise CheckFailed(f"finished outputs {sorted(seen)} do not cover 0..{count - 1}")


@rule(
    "generate.one-finish-per-output",
    SECTION,
    "A successful aggregated or decode request emits exactly one GenerationFinished for each requested output.",
)
async def one_finish_per_output(target: Target) -> None:
    stream, count = await _several(target)
    for index in range(count):
        stream.finished(index)
    if len(stream.events("finished")) != count:
        raise CheckFailed(f"{len(stream.events('finished'))} GenerationFinished events for {count} outputs")


@rule(
    "generate.nothing-after-finish",
    SECTION,
    "After GenerationFinished for an index, the engine must not emit another token or terminal event for that index.",
)
async def nothing_after_finish(target: Target) -> None:
    stream, _ = await _several(target, max_tokens=6)
    closed: set[int] = set()
    for message in stream.messages:
        kind = message.WhichOneof("event")
        if kind in ("token", "finished"):
            index = getattr(message, kind).output_index
            if index in closed:
                raise CheckFailed(f"a {kind} event for output {index} follows its GenerationFinished")
            if kind == "finished":
                closed.add(index)


@rule(
    "generate.num-sequences-default",
    SECTION,
    "num_sequences defaults to one when omitted.",
)
async def num_sequences_default(target: Target) -> None:
    target.require_generation()
    stream = (await target.run(target.prompt(max_tokens=3))).succeeded()
    indexes = {m.finished.output_index for m in stream.events("finished")}
    if indexes != {0} or len(stream.events("finished")) != 1:
        raise CheckFailed(f"omitted num_sequences produced finished outputs {sorted(indexes)}, expected only 0")


@rule(
    "generate.num-sequences-positive",
    SECTION,
    "num_sequences defaults to one when omitted and must be greater than zero when present.",
)
async def num_sequences_positive(target: Target) -> None:
    target.require_generation()
    request = target.prompt(max_tokens=2, num_sequences=0)
    await target.expect_rejected(request, grpc.StatusCode.INVALID_ARGUMENT, what="num_sequences = 0")


@rule(
    "generate.max-num-sequences",
    SECTION,
    "The remaining generation fields advertise support and limits for the corresponding request options.",
)
async def max_num_sequences(target: Target) -> None:
    target.require_generation()
    generation = target.model_info.generation
    target.require(generation.HasField("max_num_sequences"), "generation.max_num_sequences")
    request = target.prompt(max_tokens=2, num_sequences=generation.max_num_sequences + 1)
    await target.expect_rejected(
        request, grpc.StatusCode.INVALID_ARGUMENT, what="num_sequences above the advertised max_num_sequences"
    )


@rule(
    "generate.max-output-tokens",
    MODELS,
    "The remaining generation fields advertise support and limits for the corresponding request options "
    "(ModelInfo.max_output_tokens bounds stopping.max_tokens).",
)
async def max_output_tokens(target: Target) -> None:
    target.require_generation()
    info = target.model_info
    target.require(info.HasField("max_output_tokens"), "max_output_tokens")
    request = target.prompt(max_tokens=info.max_output_tokens + 1)
    await target.expect_rejected(
        request, grpc.StatusCode.INVALID_ARGUMENT, what="max_tokens above the advertised max_output_tokens"
    )


@rule(
    "generate.max-context-length",
    MODELS,
    "ModelInfo.max_context_length is the model's context: a prompt that does not fit is rejected before acceptance.",
)
async def max_context_length(target: Target) -> None:
    target.require_generation()
    info = target.model_info
    target.require(info.HasField("max_context_length"), "max_context_length")
    request = target.token_prompt(max_tokens=1)
    token = request.token_ids.ids[-1]
    request.token_ids.ids.extend([token] * info.max_context_length)
    await target.expect_rejected(request, grpc.StatusCode.INVALID_ARGUMENT, what="a prompt longer than the context")


@rule(
    "generate.usage-final-only",
    SECTION,
    "Usage is cumulative across every output in the request and is set only on the final response, which is "
    "the last GenerationFinished, PrefillReady, or the terminal EngineError.",
)
async def usage_final_only(target: Target) -> None:
    stream, _ = await _several(target)
    if stream.last.WhichOneof("event") != "finished":
        raise CheckFailed(f"a successful stream ends with {stream.last.WhichOneof('event')}, not GenerationFinished")
    early = [m.WhichOneof("event") for m in stream.messages[:-1] if m.HasField("usage")]
    if early:
        raise CheckFailed(f"usage is set on non-final responses: {early}")
    stream.usage  # noqa: B018 - raises when the final response has no usage


@rule(
    "generate.usage-cumulative",
    SECTION,
    "Usage is cumulative across every output in the request.",
)
async def usage_cumulative(target: Target) -> None:
    stream, count = await _several(target, max_tokens=3)
    emitted = sum(len(stream.tokens(i)) for i in range(count))
    usage = stream.usage
    if usage.completion_tokens != 3 * count or emitted != 3 * count:
        raise CheckFailed(
            f"{count} outputs of 3 tokens each (EOS ignored): emitted {emitted} tokens, "
            f"completion_tokens {usage.completion_tokens}"
        )
    if usage.prompt_tokens == 0:
        raise CheckFailed("prompt_tokens is 0 for a non-empty prompt")
    if usage.total_tokens != usage.prompt_tokens + usage.completion_tokens:
        raise CheckFailed(f"total_tokens {usage.total_tokens} != prompt_tokens + completion_tokens")


@rule(
    "generate.usage-subsets",
    SECTION,
    "cached_prompt_tokens is a subset of prompt_tokens; reasoning_tokens is a subset of completion_tokens.",
)
async def usage_subsets(target: Target) -> None:
    target.require_generation()
    request = target.prompt(max_tokens=4)
    again = pb.GenerateRequest()
    again.CopyFrom(request)
    again.request_id = target.request_id("again")
    for stream in (await target.run(request), await target.run(again)):  # the second may hit the prefix cache
        usage = stream.usage
        if usage.HasField("cached_prompt_tokens") and usage.cached_prompt_tokens > usage.prompt_tokens:
            raise CheckFailed(
                f"cached_prompt_tokens {usage.cached_prompt_tokens} > prompt_tokens {usage.prompt_tokens}"
            )
        if usage.HasField("reasoning_tokens") and usage.reasoning_tokens > usage.completion_tokens:
            raise CheckFailed(f"reasoning_tokens {usage.reasoning_tokens} > completion_tokens")


@rule(
    "generate.deltas",
    SECTION,
    "Every TokenOutput contains only newly emitted token records and detokenized text; neither field is cumulative.",
)
async def deltas(target: Target) -> None:
    target.require_generation()
    longer = await target.greedy(16)
    stream = (await target.run(target.prompt(temperature=0.0, max_tokens=8, ignore_eos=True))).succeeded()
    if stream.token_ids() != longer.token_ids()[:8]:
        raise CheckFailed(
            f"the 8 greedy tokens {stream.token_ids()} are not the first 8 of a 16-token greedy run "
            f"{longer.token_ids()} (repeated or cumulative token records)"
        )
    if not longer.text().startswith(stream.text()):
        raise CheckFailed(f"text {stream.text()!r} is not a prefix of the longer run's {longer.text()!r}")
    if stream.finished().reason != pb.FINISH_REASON_LENGTH:
        raise CheckFailed(f"max_tokens with EOS ignored finished {pb.FinishReason.Name(stream.finished().reason)}")


@rule(
    "generate.request-scoped-prompt",
    SECTION,
    "PromptOutput is emitted at most once when prompt token information is requested.",
)
async def no_prompt_unless_requested(target: Target) -> None:
    target.require_generation()
    stream = await target.run(target.prompt(max_tokens=2))
    if stream.events("prompt"):
        raise CheckFailed("a PromptOutput was emitted although no prompt logprobs were requested")


@rule(
    "generate.stop-match-on-stop",
    SECTION,
    "When FinishReason is STOP, stop_match identifies the matched caller stop token, stop string, or model EOS token.",
)
async def stop_match_on_stop(target: Target) -> None:
    target.require_generation()
    stream = (await target.run(target.prompt(temperature=0.0, max_tokens=64))).succeeded()
    finished = stream.finished()
    if finished.reason != pb.FINISH_REASON_STOP:
        raise NotApplicable("the model did not stop on EOS within 64 greedy tokens")
    if finished.stop_match.WhichOneof("match") != "eos_token_id":
        raise CheckFailed(f"a STOP without caller stops has stop_match {finished.stop_match}, expected eos_token_id")


@rule(
    "generate.unknown-model",
    SECTION,
    "An unknown model returns gRPC NOT_FOUND (as for GetModelInfo and the task RPCs).",
)
async def unknown_model(target: Target) -> None:
    request = target.prompt(max_tokens=1)
    request.model = "conformance-no-such-model"
    await target.expect_rejected(request, grpc.StatusCode.NOT_FOUND, what="an unknown model")


@rule(
    "generate.duplicate-request-id",
    SECTION,
    "Request IDs share the same namespace and abort semantics as generation request IDs: an in-flight id is "
    "not accepted twice.",
)
async def duplicate_request_id(target: Target) -> None:
    target.require_generation()
    request = target.long_request()
    call = target.open_call(request)
    try:
        await call.first()
        duplicate = target.prompt(max_tokens=1)
        duplicate.request_id = request.request_id
        try:
            await target.expect_rejected(
                duplicate, grpc.StatusCode.ALREADY_EXISTS, what="a second Generate with an in-flight request_id"
            )
        except CheckFailed:
            if await still_running(target, request.request_id, call.rest()):
                raise
            raise NotApplicable("the long request ended about when its duplicate arrived") from None
    finally:
        call.cancel()


@rule(
    "generate.accepted-stream-ok",
    "Standard errors",
    "Accepted request, application failure: exactly one terminal EngineError event, gRPC OK after the event. "
    "The last GenerationFinished ends a successful aggregated or decode stream.",
)
async def accepted_stream_ok(target: Target) -> None:
    stream, _ = await _several(target)
    terminal = [m for m in stream.messages if m.WhichOneof("event") in ("error", "prefill_ready")]
    if terminal:
        raise CheckFailed(f"an aggregated stream carried {terminal[0].WhichOneof('event')}")


@rule(
    "role.kv-session-only-on-decode",
    ROLES,
    "Engines must validate role/request compatibility before acceptance and return a non-OK gRPC status on mismatch.",
)
async def aggregated_rejects_session(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_AGGREGATED, pb.ENGINE_ROLE_PREFILL)
    request = target.prompt(max_tokens=1)
    request.kv.session.CopyFrom(
        pb.KvSessionRef(session_id="conformance-session", endpoints=[pb.KvEndpoint(host="127.0.0.1", port=9)])
    )
    role = pb.EngineRole.Name(target.role)
    await target.expect_rejected(request, what=f"a decode request (kv.session) sent to a {role} engine")


@rule(
    "role.decode-requires-kv-session",
    ROLES,
    "DECODE: accepts decode requests with KV session/handoff metadata. Engines must validate role/request "
    "compatibility before acceptance and return a non-OK gRPC status on mismatch.",
)
async def decode_requires_session(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_DECODE)
    await target.expect_rejected(target.prompt(max_tokens=1), what="a request without kv.session on a decode engine")


@rule(
    "role.prefill-ready-terminal",
    ROLES,
    "PREFILL: accepts prefill requests, builds KV state, emits handoff/session readiness, and does not perform "
    "normal decode generation. PrefillReady is the terminal success event for a prefill-only request.",
)
async def prefill_ready_terminal(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_PREFILL)
    stream = (await target.run(target.prompt(max_tokens=4))).succeeded()
    kinds = [m.WhichOneof("event") for m in stream.messages]
    if kinds[-1:] != ["prefill_ready"] or "token" in kinds or "finished" in kinds:
        raise CheckFailed(f"a prefill stream has events {kinds}; expected PrefillReady last and no decode output")
    if not stream.last.prefill_ready.kv_session.session_id:
        raise CheckFailed("PrefillReady carries no kv_session.session_id")
    if kinds.count("prefill_ready") != 1:
        raise CheckFailed("more than one PrefillReady")
    stream.usage  # noqa: B018 - raises when PrefillReady has no usage


__all__: list[str] = []
