"""Abort by request, KV session or all; client cancellation and deadlines stop engine work."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

import grpc

from ... import pb
from ...client import StatusError
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import OpenCall, Stream

SECTION = "Health, abort, and drain"
_TARGETS = (
    "Exactly one abort target must be set. An unknown request or KV session target returns gRPC NOT_FOUND; an "
    "engine that does not support abort returns gRPC UNIMPLEMENTED. ALREADY_FINISHED remains a successful "
    "idempotent outcome rather than an error."
)


_STREAMED_ON_S = 0.5
"""A request that Abort called finished has nothing left to stream but what was already on its way."""


async def abort_request(target: Target, request: pb.AbortRequest) -> pb.AbortResponse:
    """Abort, treating UNIMPLEMENTED (an engine without abort) as not applicable."""
    try:
        return await target.client.abort(request)
    except StatusError as error:
        if error.code == grpc.StatusCode.UNIMPLEMENTED:
            raise NotApplicable("the engine does not support abort (UNIMPLEMENTED)") from None
        raise


async def still_running(target: Target, request_id: str, rest: Awaitable[Stream]) -> bool:
    """Whether the gateway still runs ``request_id``: an Abort that finds it ABORTED says so; then ``rest``
    (its stream's reading) is awaited to the end, whatever status the stream ends with.

    A check that saw the gateway act as if a request it opened had ended asks this before failing: the
    client may not have read the stream's end yet (its last messages queue behind a later answer while
    the client waits for a CPU). A request found finished, or forgotten, leaves the order unknown."""
    try:
        aborted = await target.client.abort(pb.AbortRequest(request_id=request_id), timeout_s=target.timeout_s)
    except StatusError:  # NOT_FOUND once forgotten; UNIMPLEMENTED where an engine cannot abort
        aborted = None
    with contextlib.suppress(StatusError):
        await rest
    return aborted is not None and aborted.status == pb.ABORT_STATUS_ABORTED


def cancelled_cleanly(stream: Stream, outputs: int = 1) -> None:
    """An aborted stream still ends with one terminal event per output, CANCELLED where unfinished, and
    its usage counts every token emitted before the abort."""
    stream.succeeded()
    reasons = [stream.finished(i).reason for i in range(outputs)]
    if pb.FINISH_REASON_CANCELLED not in reasons:
        names = [pb.FinishReason.Name(r) for r in reasons]
        raise CheckFailed(f"the aborted request finished {names}; an aborted output finishes CANCELLED")
    if stream.last.WhichOneof("event") != "finished" or not stream.last.HasField("usage"):
        raise CheckFailed("the aborted stream does not end with a GenerationFinished carrying usage")
    usage, emitted = stream.usage, sum(len(stream.tokens(i)) for i in range(outputs))
    if usage.completion_tokens < emitted:
        raise CheckFailed(f"the aborted request emitted {emitted} tokens but reports {usage.completion_tokens}")


async def idle(target: Target, within_s: float = 2.0) -> None:
    """Wait until the engine reports nothing running or queued (``NotApplicable`` when it cannot say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        load = await target.client.load()
        target.require(
            load.HasField("running_requests") and load.HasField("queued_requests"), "running and queued request counts"
        )
        if load.running_requests == 0 and load.queued_requests == 0:
            return
        if loop.time() >= deadline:
            raise CheckFailed(
                f"engine work did not stop: {load.running_requests} running, {load.queued_requests} queued "
                f"{within_s:g}s later"
            )
        await asyncio.sleep(0.05)


@rule(
    "abort.target-required",
    SECTION,
    "Use all_requests {} to abort every request; omitting the target returns gRPC INVALID_ARGUMENT.",
)
async def target_required(target: Target) -> None:
    target.require(await _abort_implemented(target) is not False, "Abort (it answers UNIMPLEMENTED)")
    await target.expect_status(
        target.client.abort(pb.AbortRequest()), grpc.StatusCode.INVALID_ARGUMENT, what="Abort without a target"
    )


@rule("abort.unknown-request", SECTION, _TARGETS)
async def unknown_request(target: Target) -> None:
    request = pb.AbortRequest(request_id=target.request_id("never-sent"))
    codes = [grpc.StatusCode.NOT_FOUND]
    if await _abort_implemented(target) is not True:  # UNIMPLEMENTED only from an engine without abort
        codes.append(grpc.StatusCode.UNIMPLEMENTED)
    await target.expect_status(target.client.abort(request), *codes, what="unknown id")


async def _abort_implemented(target: Target) -> bool | None:
    """Whether Abort works here, from an Abort of a finished request (None: no request to probe with)."""
    if target.role != pb.ENGINE_ROLE_AGGREGATED or not target.model_info.HasField("generation"):
        return None
    request = target.prompt(max_tokens=1)
    (await target.run(request)).succeeded()
    try:
        await target.client.abort(pb.AbortRequest(request_id=request.request_id))
    except StatusError as error:
        if error.code == grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise
    return True


@rule("abort.unknown-kv-session", SECTION, _TARGETS)
async def unknown_kv_session(target: Target) -> None:
    request = pb.AbortRequest(kv_session=pb.KvSessionRef(session_id=target.request_id("no-session")))
    await target.expect_status(
        target.client.abort(request),
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
        what="an unknown KV session",
    )


@rule("abort.already-finished", SECTION, _TARGETS)
async def already_finished(target: Target) -> None:
    target.require_generation()
    request = target.prompt(max_tokens=1)
    (await target.run(request)).succeeded()
    for attempt in ("first", "second"):
        response = await abort_request(target, pb.AbortRequest(request_id=request.request_id))
        if response.status != pb.ABORT_STATUS_ALREADY_FINISHED:
            raise CheckFailed(
                f"the {attempt} Abort of a finished request answered {pb.AbortStatus.Name(response.status)}, "
                "expected ALREADY_FINISHED"
            )


@rule(
    "abort.in-flight",
    SECTION,
    "Abort stops an accepted request: the request ends with its terminal events (FINISH_REASON_CANCELLED for "
    "outputs that had not completed) and the engine stops working on it; ALREADY_FINISHED afterwards.",
)
async def in_flight(target: Target) -> None:
    target.require_generation()
    request = target.long_request()
    call = target.open_call(request)
    try:
        await call.first()
        response = await abort_request(target, pb.AbortRequest(request_id=request.request_id))
        answered = asyncio.get_running_loop().time()
        stream = await call.rest()
    finally:
        call.cancel()  # a no-op once read to the end; else the request is not left running
    if response.status == pb.ABORT_STATUS_ALREADY_FINISHED:
        streamed_on = asyncio.get_running_loop().time() - answered
        if streamed_on > _STREAMED_ON_S:
            raise CheckFailed(
                f"Abort answered ALREADY_FINISHED, but the request streamed on for {streamed_on:.1f}s after it"
            )
        raise NotApplicable("the request finished before the Abort arrived")
    if response.status != pb.ABORT_STATUS_ABORTED:
        raise CheckFailed(f"Abort of an in-flight request answered {pb.AbortStatus.Name(response.status)}")
    cancelled_cleanly(stream)
    again = await abort_request(target, pb.AbortRequest(request_id=request.request_id))
    if again.status != pb.ABORT_STATUS_ALREADY_FINISHED:
        raise CheckFailed(f"a second Abort answered {pb.AbortStatus.Name(again.status)}, expected ALREADY_FINISHED")
    await idle(target)


@rule(
    "abort.usage",
    SECTION,
    "Usage is cumulative across every output in the request and is set only on the final response: an aborted "
    "request's final response counts its prompt and the tokens it emitted.",
)
async def usage(target: Target) -> None:
    target.require_generation()
    request = target.long_request()
    call = target.open_call(request)
    try:
        await call.first()
        response = await abort_request(target, pb.AbortRequest(request_id=request.request_id))
        stream = (await call.rest()).succeeded()
    finally:
        call.cancel()  # a no-op once read to the end; else the request is not left running
    if response.status != pb.ABORT_STATUS_ABORTED:
        raise NotApplicable("the request finished before the Abort arrived")
    prompt, emitted = stream.usage.prompt_tokens, len(stream.tokens())
    if prompt == 0 or stream.usage.completion_tokens < emitted:
        raise CheckFailed(
            f"the aborted request's usage ({prompt} prompt, {stream.usage.completion_tokens} completion tokens) "
            f"does not count its prompt and the {emitted} tokens it emitted"
        )


@rule(
    "abort.all-requests",
    SECTION,
    "Use all_requests {} to abort every request.",
    disruptive=True,
)
async def all_requests(target: Target) -> None:
    target.require_generation()
    calls = [target.open_call(target.long_request()) for _ in range(2)]
    try:
        for held in calls:
            await held.first()
        response = await abort_request(target, pb.AbortRequest(all_requests=pb.AllRequests()))
        if response.status != pb.ABORT_STATUS_ABORTED:
            raise CheckFailed(f"Abort(all_requests) answered {pb.AbortStatus.Name(response.status)}")
        for held in calls:
            cancelled_cleanly(await held.rest())
    finally:
        for held in calls:
            held.cancel()
    await idle(target)


@rule(
    "abort.kv-session",
    SECTION,
    "Engine owns KV session lifetime and cleanup, including finish, abort, drain, timeout, and transfer failure "
    "paths. An unknown request or KV session target returns gRPC NOT_FOUND.",
)
async def kv_session(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_PREFILL)
    connector = target.engine_info.kv_connector
    target.require(connector.supports_abort_cleanup, "kv_connector.supports_abort_cleanup")
    stream = (await target.run(target.prompt(max_tokens=1))).succeeded()
    session = stream.last.prefill_ready.kv_session
    response = await abort_request(target, pb.AbortRequest(kv_session=session))
    if response.status != pb.ABORT_STATUS_ABORTED:
        raise CheckFailed(f"Abort of a held KV session answered {pb.AbortStatus.Name(response.status)}")
    with contextlib.suppress(StatusError):
        again = await target.client.abort(pb.AbortRequest(kv_session=session))
        if again.status != pb.ABORT_STATUS_ALREADY_FINISHED:
            raise CheckFailed(f"a second Abort of the session answered {pb.AbortStatus.Name(again.status)}")
    load = await target.client.load()
    if load.HasField("active_kv_sessions") and load.active_kv_sessions != 0:
        raise CheckFailed(f"{load.active_kv_sessions} KV sessions remain open after aborting the only one")


async def _cancel_after_first(call: OpenCall) -> None:
    await call.first()
    call.cancel()


@rule(
    "cancel.client-cancellation",
    "Non-generative task API",
    "Client cancellation or deadline expiration stops queued or running work.",
)
async def client_cancellation(target: Target) -> None:
    target.require_generation()
    await _cancel_after_first(target.open_call(target.long_request()))
    await idle(target)


@rule(
    "cancel.deadline",
    "Non-generative task API",
    "Client cancellation or deadline expiration stops queued or running work.",
)
async def deadline(target: Target) -> None:
    target.require_generation()
    try:
        async for _ in target.client.stream(target.long_request(), timeout_s=0.3):
            pass
    except StatusError as error:
        if error.code != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    else:
        raise NotApplicable("the long request finished within its 0.3 s deadline")
    await idle(target)


__all__ = ["abort_request", "cancelled_cleanly", "idle"]
