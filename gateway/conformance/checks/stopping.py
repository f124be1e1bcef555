"""Stop tokens, stop strings, include_stop_in_output and max_tokens, with triggers taken from
the model's own greedy output (so nothing about its vocabulary is assumed)."""

from __future__ import annotations

import grpc

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import Stream, advertised, denied

SECTION = "Generation API"
_STOP = (
    "When FinishReason is STOP, stop_match identifies the matched caller stop token, stop string, or model EOS token."
)
_INCLUDE = (
    "include_stop_in_output controls whether a matched caller-supplied stop token or string remains in emitted output."
)
_STOP_REMOVED = (
    f"{_STOP} {_INCLUDE} (Unset, it is false: the matched stop token's record and text, or the stop string, "
    "are not emitted, whether or not the model advertises supports_stop_in_output.)"
)
_LENGTH = 16


async def _stop_token(target: Target) -> tuple[int, list[int]]:
    """A token the greedy output reaches after a few others, and the tokens before it.

    A stop token id is token-id input: a model that denies token-id input (a split whose engines'
    tokenizers differ, where an id from one response means another token on the next engine)
    refuses it, so the stop-token rules need token-id input not to be denied (absent: unknown).
    """
    target.require(not denied(target.model_info, "supports_token_ids_input"), "token-id input (stop token ids)")
    greedy = await target.greedy(_LENGTH)
    ids = greedy.token_ids()
    tokens = greedy.tokens()
    with_text = any(info.token for info in tokens)  # token text may be reported only with logprobs
    candidates = [
        (position, info.token_id)
        for position, info in enumerate(tokens)
        if info.token_id not in ids[:position] and (info.token.strip() or not with_text)
    ]
    if not candidates:
        raise NotApplicable("the greedy output has no distinct token to stop on")
    position, token = max(candidates, key=lambda c: min(c[0], 2))  # a few tokens in, where possible
    return token, ids[:position]


async def _stop_text(target: Target) -> tuple[str, str]:
    """A short string the greedy text reaches after a few characters, and the text before it."""
    text = (await target.greedy(_LENGTH)).text()
    starts = [
        start
        for start in range(len(text) - 1)
        if (stop := text[start : start + 2]).strip() and "\ufffd" not in text[: start + 2] and text.find(stop) == start
    ]
    if not starts:
        raise NotApplicable("the greedy text has no usable stop string")
    start = max(starts, key=lambda s: min(s, 2))  # a few characters in, where possible
    return text[start : start + 2], text[:start]


def _stopped(stream: Stream, field: str, value: object) -> None:
    finished = stream.succeeded().finished()
    if finished.reason != pb.FINISH_REASON_STOP:
        raise CheckFailed(f"the output finished {pb.FinishReason.Name(finished.reason)}, expected STOP on {value!r}")
    match = finished.stop_match
    if match.WhichOneof("match") != field or getattr(match, field) != value:
        raise CheckFailed(f"stop_match is {match} , expected {field} = {value!r}")


def _supports_include(target: Target) -> bool:
    generation = target.model_info.generation
    return advertised(generation, "supports_stop_in_output")


@rule("stopping.stop-token", SECTION, _STOP_REMOVED)
async def stop_token(target: Target) -> None:
    target.require_generation()
    token, before = await _stop_token(target)
    request = target.prompt(temperature=0.0, max_tokens=_LENGTH, ignore_eos=True)
    request.stopping.conditions.add(stop_token_id=token)
    stream = await target.run(request)
    _stopped(stream, "stop_token_id", token)
    if stream.token_ids() != before:
        raise CheckFailed(
            f"tokens {stream.token_ids()}, expected the greedy tokens before the stop token {token} ({before}): "
            "include_stop_in_output is false unless set, so the matched stop token is not emitted"
        )


@rule("stopping.stop-text", SECTION, _STOP_REMOVED)
async def stop_text(target: Target) -> None:
    target.require_generation()
    stop, before = await _stop_text(target)
    request = target.prompt(temperature=0.0, max_tokens=_LENGTH, ignore_eos=True)
    request.stopping.conditions.add(stop_text=stop)
    stream = await target.run(request)
    _stopped(stream, "stop_text", stop)
    if stream.text() != before:
        raise CheckFailed(
            f"text {stream.text()!r}, expected the greedy text before the stop string {stop!r} ({before!r}): "
            "include_stop_in_output is false unless set, so the matched stop string is not emitted"
        )


@rule("stopping.include-stop-token", SECTION, _INCLUDE)
async def include_stop_token(target: Target) -> None:
    target.require_generation()
    target.require(_supports_include(target), "supports_stop_in_output")
    token, before = await _stop_token(target)
    for include, expected in ((False, before), (True, [*before, token])):
        request = target.prompt(temperature=0.0, max_tokens=_LENGTH, ignore_eos=True, include_stop_in_output=include)
        request.stopping.conditions.add(stop_token_id=token)
        stream = await target.run(request)
        _stopped(stream, "stop_token_id", token)
        if stream.token_ids() != expected:
            raise CheckFailed(f"include_stop_in_output={include}: tokens {stream.token_ids()}, expected {expected}")


@rule("stopping.include-stop-text", SECTION, _INCLUDE)
async def include_stop_text(target: Target) -> None:
    target.require_generation()
    target.require(_supports_include(target), "supports_stop_in_output")
    stop, before = await _stop_text(target)
    for include, expected in ((False, before), (True, before + stop)):
        request = target.prompt(temperature=0.0, max_tokens=_LENGTH, ignore_eos=True, include_stop_in_output=include)
        request.stopping.conditions.add(stop_text=stop)
        stream = await target.run(request)
        _stopped(stream, "stop_text", stop)
        if stream.text() != expected:
            raise CheckFailed(f"include_stop_in_output={include}: text {stream.text()!r}, expected {expected!r}")


@rule(
    "stopping.include-unadvertised",
    SECTION,
    "The remaining generation fields advertise support and limits for the corresponding request options "
    "(supports_stop_in_output for include_stop_in_output).",
)
async def include_unadvertised(target: Target) -> None:
    target.require_generation()
    target.require(
        denied(target.model_info.generation, "supports_stop_in_output"),
        "supports_stop_in_output = false (absent is unreported, not unsupported)",
    )
    request = target.prompt(max_tokens=1, include_stop_in_output=True)
    await target.expect_rejected(
        request, grpc.StatusCode.INVALID_ARGUMENT, what="include_stop_in_output on a model that does not advertise it"
    )


@rule(
    "stopping.max-tokens",
    SECTION,
    "StoppingOptions.max_tokens bounds each output: with EOS ignored an output ends with FINISH_REASON_LENGTH "
    "after exactly max_tokens tokens.",
)
async def max_tokens(target: Target) -> None:
    target.require_generation()
    stream = (await target.run(target.prompt(max_tokens=5, ignore_eos=True))).succeeded()
    finished = stream.finished()
    if finished.reason != pb.FINISH_REASON_LENGTH or len(stream.tokens()) != 5:
        raise CheckFailed(
            f"max_tokens=5: {len(stream.tokens())} tokens, finished {pb.FinishReason.Name(finished.reason)}"
        )
    if finished.HasField("stop_match"):
        raise CheckFailed("a LENGTH finish carries a stop_match")


__all__: list[str] = []
