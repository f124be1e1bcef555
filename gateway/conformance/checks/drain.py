"""Drain: progress events then one terminal event, deadlines, and admission once draining."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import check_engine_error
from .abort import cancelled_cleanly, still_running

SECTION = "Health, abort, and drain"
_STATES = (
    "STARTED and IN_PROGRESS are progress events; COMPLETE is terminal. A failure after the drain is accepted is "
    "represented by one terminal EngineError, not by a failed drain state."
)


async def drain(
    target: Target, request: pb.DrainRequest, *, on_started: Callable[[], None] | None = None
) -> list[pb.DrainResponse]:
    """Every response of a Drain call, checked: progress first, one terminal event last.

    ``on_started`` is called as the first response arrives."""
    responses: list[pb.DrainResponse] = []
    async for response in target.client.drain(request, timeout_s=target.timeout_s):
        if not responses and on_started is not None:
            on_started()
        responses.append(response)
    kinds = [pb.DrainState.Name(r.state) if r.HasField("state") else "error" for r in responses]
    if not responses or kinds[0] not in ("DRAIN_STATE_STARTED", "error"):
        raise CheckFailed(f"a drain stream begins {kinds[:1]}, expected DRAIN_STATE_STARTED")
    if kinds[-1] not in ("DRAIN_STATE_COMPLETE", "error"):
        raise CheckFailed(f"a drain stream ends {kinds[-1]}, expected COMPLETE or one terminal EngineError")
    if any(k in ("DRAIN_STATE_COMPLETE", "error", "DRAIN_STATE_UNSPECIFIED") for k in kinds[:-1]):
        raise CheckFailed(f"a terminal (or unspecified) event precedes the end of the drain stream: {kinds}")
    if kinds.count("DRAIN_STATE_STARTED") != 1:
        raise CheckFailed(f"the drain stream has {kinds.count('DRAIN_STATE_STARTED')} STARTED events")
    last = responses[-1]
    if last.HasField("error"):
        check_engine_error(last.error, "the drain's EngineError")
    return responses


def complete(responses: list[pb.DrainResponse]) -> pb.DrainResponse:
    """The terminal COMPLETE, after requiring that the drain did not fail."""
    last = responses[-1]
    if not last.HasField("state"):
        raise CheckFailed(f"the drain failed: {pb.ErrorCode.Name(last.error.code)}: {last.error.message}")
    for name in ("in_flight_requests", "open_kv_sessions"):
        if last.HasField(name) and getattr(last, name) != 0:
            raise CheckFailed(f"COMPLETE reports {name} = {getattr(last, name)}; present counts at COMPLETE are 0")
    return last


@rule("drain.progress-then-complete", SECTION, _STATES)
async def progress_then_complete(target: Target) -> None:
    complete(await drain(target, pb.DrainRequest()))


@rule(
    "drain.deadline-zero",
    SECTION,
    "An absent deadline_ms means no deadline; an explicit zero means the deadline is immediate. Absent progress "
    "counts are unknown, while present zero values report that no requests or KV sessions remain.",
)
async def deadline_zero(target: Target) -> None:
    responses = await drain(target, pb.DrainRequest(deadline_ms=0))
    started = responses[0]
    still_running = started.HasField("state") and (
        not started.HasField("in_flight_requests") or started.in_flight_requests > 0
    )
    if responses[-1].HasField("error") and still_running:
        return  # work still in flight at an immediate deadline (not aborted): one terminal EngineError is right
    complete(responses)


@rule(
    "drain.waits-for-in-flight",
    SECTION,
    "An absent deadline_ms means no deadline. Absent progress counts are unknown, while present zero values "
    "report that no requests or KV sessions remain.",
)
async def waits_for_in_flight(target: Target) -> None:
    target.require_generation()
    call = target.open_call(target.long_request())
    await call.first()
    rest = asyncio.ensure_future(call.rest())
    ended_first: list[bool] = []
    responses = await drain(target, pb.DrainRequest(), on_started=lambda: ended_first.append(rest.done()))
    started = responses[0]
    if started.HasField("in_flight_requests") and started.in_flight_requests == 0:
        if ended_first == [True]:  # a zero-cost engine can finish the request before the drain starts
            raise NotApplicable("the long request ended before the drain started")
        if await still_running(target, call.request.request_id, rest):
            raise CheckFailed("STARTED reports in_flight_requests = 0 while a request runs (an Abort found it running)")
        raise NotApplicable("the long request ended about when the drain started (the client read its end later)")
    complete(responses)
    stream = (await rest).succeeded()
    if stream.finished(0).reason == pb.FINISH_REASON_CANCELLED:
        raise CheckFailed("a drain without a deadline cancelled the request in flight instead of waiting for it")


@rule(
    "drain.stops-admission",
    SECTION,
    "stop_accepting_new_requests: once the drain is accepted new requests are refused before acceptance, and "
    "Health reports HEALTH_STATE_DRAINING.",
    disruptive=True,
)
async def stops_admission(target: Target) -> None:
    complete(await drain(target, pb.DrainRequest(stop_accepting_new_requests=True)))
    if target.role == pb.ENGINE_ROLE_AGGREGATED or target.role == pb.ENGINE_ROLE_PREFILL:
        await target.expect_rejected(
            target.prompt(max_tokens=1), grpc.StatusCode.UNAVAILABLE, what="Generate after a drain"
        )
    health = await target.client.health()
    if health.state != pb.HEALTH_STATE_DRAINING:
        raise CheckFailed(f"Health reports {pb.HealthState.Name(health.state)} after a drain, expected DRAINING")


@rule(
    "drain.abort-after-deadline",
    SECTION,
    "An explicit zero means the deadline is immediate; abort_after_deadline aborts what is still in flight at "
    "the deadline, and the drain then completes.",
    disruptive=True,
)
async def abort_after_deadline(target: Target) -> None:
    target.require_generation()
    call = target.open_call(target.long_request())
    await call.first()
    responses, stream = await asyncio.gather(
        drain(target, pb.DrainRequest(deadline_ms=0, abort_after_deadline=True)), call.rest()
    )
    complete(responses)
    cancelled_cleanly(stream)


__all__ = ["complete", "drain"]
