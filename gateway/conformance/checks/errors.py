"""Error phases: a rejection before acceptance is a status with no event; an accepted failure is one event."""

from __future__ import annotations

import grpc

from ..kit import CheckFailed, Target, rule

SECTION = "Standard errors"


@rule(
    "errors.rejection-has-no-event",
    SECTION,
    "Errors have exactly one transport based on when and where they occur: before request acceptance, a non-OK "
    "gRPC status and no response event (for a caller's error, never INTERNAL or UNKNOWN).",
)
async def rejection_has_no_event(target: Target) -> None:
    no_input = target.prompt(max_tokens=1)
    no_input.ClearField("prompt")
    no_input.ClearField("token_ids")
    unknown = target.prompt(max_tokens=1)
    unknown.model = "conformance-no-such-model"
    no_outputs = target.prompt(max_tokens=1, num_sequences=0)
    for what, request in (
        ("a request without input", no_input),
        ("a request for an unknown model", unknown),
        ("num_sequences = 0", no_outputs),
    ):
        error = await target.expect_rejected(request, what=what)
        if error.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            raise CheckFailed(f"{what}: rejected as {error.code.name}, a server failure, not the caller's error")


__all__: list[str] = []
