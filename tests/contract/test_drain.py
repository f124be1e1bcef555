"""Drain with requests and KV sessions in flight: deadlines, progress counts, admission, health."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.conformance.checks.abort import cancelled_cleanly
from openengine_gateway.spi import Load
from openengine_gateway.testing import serve_backends

from .conftest import Served, mock, serve


async def drain(served: Served, **fields: object) -> list[pb.DrainResponse]:
    return [r async for r in served.client.drain(pb.DrainRequest(**fields), timeout_s=10)]


def states(responses: list[pb.DrainResponse]) -> list[str]:
    return [pb.DrainState.Name(r.state)[12:] if r.HasField("state") else "error" for r in responses]


async def test_without_a_deadline_the_drain_waits_for_in_flight_requests() -> None:
    async with serve() as served:
        call = served.target.open_call(served.target.prompt(max_tokens=40, ignore_eos=True))
        await call.first()
        responses = await drain(served)
        stream = await call.rest()
    assert states(responses)[0] == "STARTED" and states(responses)[-1] == "COMPLETE"
    assert set(states(responses)[1:-1]) <= {"IN_PROGRESS"}
    assert (responses[0].in_flight_requests, responses[0].open_kv_sessions) == (1, 0)
    assert (responses[-1].in_flight_requests, responses[-1].open_kv_sessions) == (0, 0)
    assert stream.finished().reason == pb.FINISH_REASON_LENGTH and len(stream.tokens()) == 40


async def test_an_immediate_deadline_without_abort_fails_the_drain_and_leaves_requests_running() -> None:
    async with serve() as served:
        call = served.target.open_call(served.target.prompt(max_tokens=40, ignore_eos=True))
        await call.first()
        responses = await drain(served, deadline_ms=0)
        stream = await call.rest()
    assert states(responses) == ["STARTED", "error"]
    error = responses[-1].error
    assert error.code == pb.ERROR_CODE_DRAINING and error.retryable
    assert error.details["in_flight_requests"] == 1
    assert stream.finished().reason == pb.FINISH_REASON_LENGTH


async def test_abort_after_deadline_cancels_what_is_left_then_completes() -> None:
    async with serve() as served:
        target = served.target
        calls = [target.open_call(target.long_request()) for _ in range(2)]
        for call in calls:
            await call.first()
        responses, *streams = await asyncio.gather(
            drain(served, deadline_ms=100, abort_after_deadline=True), *(c.rest() for c in calls)
        )
        load = await served.client.load()
    assert states(responses)[0] == "STARTED" and states(responses)[-1] == "COMPLETE"
    assert responses[-1].in_flight_requests == 0
    for stream in streams:
        cancelled_cleanly(stream)
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)


async def test_stop_accepting_refuses_new_work_while_in_flight_work_finishes() -> None:
    async with serve() as served:
        target = served.target
        call = target.open_call(target.prompt(max_tokens=60, ignore_eos=True))
        await call.first()
        drained = asyncio.ensure_future(drain(served, stop_accepting_new_requests=True))
        await asyncio.sleep(0.05)
        error = await target.expect_rejected(target.prompt(max_tokens=1), grpc.StatusCode.UNAVAILABLE, what="new")
        embed = pb.EmbedRequest(context=pb.TaskRequestContext(request_id="e", model="model"))
        embed.inputs.add(item_id="i", text="x")
        await target.expect_status(target.client.embed(embed), grpc.StatusCode.UNAVAILABLE, what="new Embed")
        health = await target.client.health()
        responses = await drained
        stream = await call.rest()
        after = await target.client.health()
    assert error.retry_after_ms is not None
    assert health.state == after.state == pb.HEALTH_STATE_DRAINING
    assert states(responses)[-1] == "COMPLETE" and stream.finished().reason == pb.FINISH_REASON_LENGTH


async def test_a_prefill_engine_drains_its_held_kv_sessions() -> None:
    async with serve(role="prefill") as served:
        ready = (await served.target.run(served.target.prompt())).succeeded()
        waiting = asyncio.ensure_future(drain(served))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # a held session keeps the drain open
        await served.client.abort(pb.AbortRequest(kv_session=ready.last.prefill_ready.kv_session))
        released = await waiting
        await served.target.run(served.target.prompt())
        deadline = await drain(served, deadline_ms=0, abort_after_deadline=True)
        load = await served.client.load()
    assert released[0].open_kv_sessions == 1 and states(released)[-1] == "COMPLETE"
    assert released[-1].open_kv_sessions == 0
    assert deadline[0].open_kv_sessions == 1 and states(deadline)[-1] == "COMPLETE"
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)


class NoSessionCount(MockBackend):
    """A mock whose load snapshot cannot report KV sessions (the field is absent: unknown)."""

    async def load(self) -> Load:
        return replace(await super().load(), active_kv_sessions=None)


async def test_absent_progress_counts_stay_absent() -> None:
    backend = NoSessionCount(mock().settings)
    async with serve_backends([("model", backend)]) as running:
        responses = [r async for r in running.stub.Drain(pb.DrainRequest())]
    assert states(responses) == ["STARTED", "COMPLETE"]
    assert all(r.HasField("in_flight_requests") and not r.HasField("open_kv_sessions") for r in responses)
