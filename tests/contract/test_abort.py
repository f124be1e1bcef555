"""Abort by request id, KV session or all; client cancellation and deadlines; the shared id namespace."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.client import StatusError
from openengine_gateway.conformance.checks.abort import cancelled_cleanly, idle
from openengine_gateway.spi import EngineFacts
from openengine_gateway.testing import serve_backends

from .conftest import Served, mock, serve

SLOW_TASKS = {"prefill_time_per_token_s": 0.02}
"""Task inputs take 20 ms per token: a 60-token Embed runs for over a second unless stopped."""


def embed_request(request_id: str, text: str = "x" * 60) -> pb.EmbedRequest:
    request = pb.EmbedRequest(context=pb.TaskRequestContext(request_id=request_id, model="model"))
    request.inputs.add(item_id="only", text=text)
    return request


async def started(served: Served, request_id: str) -> None:
    """Wait until ``request_id`` is in flight in the gateway."""
    for _ in range(200):
        if served.running.gateway.registry.get(request_id) is not None:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{request_id} never started")


async def test_abort_by_id_cancels_the_stream_and_frees_the_engine() -> None:
    async with serve() as served:
        request = served.target.long_request(num_sequences=2)
        call = served.target.open_call(request)
        await call.first()
        aborted = await served.client.abort(pb.AbortRequest(request_id=request.request_id))
        stream = await call.rest()
        await idle(served.target, within_s=0.5)
        again = await served.client.abort(pb.AbortRequest(request_id=request.request_id))
        load = await served.client.load()
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    cancelled_cleanly(stream, outputs=2)
    assert {stream.finished(i).reason for i in range(2)} == {pb.FINISH_REASON_CANCELLED}
    assert stream.usage.prompt_tokens == 45
    assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED and load.used_kv_blocks == 0


async def test_abort_targets_and_outcomes() -> None:
    async with serve() as served:
        client = served.client
        finished = served.target.prompt(max_tokens=2)
        await served.target.run(finished)
        outcomes = [await client.abort(pb.AbortRequest(request_id=finished.request_id)) for _ in range(2)]
        for request, code in (
            (pb.AbortRequest(), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.AbortRequest(request_id=""), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.AbortRequest(request_id="never-sent"), grpc.StatusCode.NOT_FOUND),
            (pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="none")), grpc.StatusCode.NOT_FOUND),
        ):
            with pytest.raises(StatusError) as rejected:
                await client.abort(request)
            assert rejected.value.code == code, request
        everything = await client.abort(pb.AbortRequest(all_requests=pb.AllRequests()))
    assert [o.status for o in outcomes] == [pb.ABORT_STATUS_ALREADY_FINISHED] * 2
    assert everything.status == pb.ABORT_STATUS_ABORTED


async def test_abort_all_stops_generations_and_tasks() -> None:
    async with serve(**SLOW_TASKS) as served:
        calls = [served.target.open_call(served.target.long_request()) for _ in range(2)]
        for call in calls:
            await call.first()
        embedding = asyncio.ensure_future(served.client.embed(embed_request("slow-embed")))
        await started(served, "slow-embed")
        aborted = await served.client.abort(pb.AbortRequest(all_requests=pb.AllRequests()))
        streams = [await call.rest() for call in calls]
        with pytest.raises(StatusError) as cancelled:
            await embedding
        await idle(served.target, within_s=0.5)
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    for stream in streams:
        cancelled_cleanly(stream)
    assert cancelled.value.code == grpc.StatusCode.CANCELLED


async def test_a_task_aborted_by_id_answers_cancelled() -> None:
    async with serve(**SLOW_TASKS) as served:
        loop = asyncio.get_running_loop()
        start = loop.time()
        embedding = asyncio.ensure_future(served.client.embed(embed_request("task")))
        await started(served, "task")
        aborted = await served.client.abort(pb.AbortRequest(request_id="task"))
        with pytest.raises(StatusError) as cancelled:
            await embedding
        elapsed = loop.time() - start
        again = await served.client.abort(pb.AbortRequest(request_id="task"))
    assert aborted.status == pb.ABORT_STATUS_ABORTED and cancelled.value.code == grpc.StatusCode.CANCELLED
    assert elapsed < 0.8  # the 1.2 s of work stopped
    assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED


async def test_client_cancellation_and_deadlines_stop_engine_work() -> None:
    async with serve(**SLOW_TASKS) as served:
        target, loop = served.target, asyncio.get_running_loop()
        call = target.open_call(target.long_request())
        await call.first()
        call.cancel()
        await idle(target, within_s=0.5)
        start = loop.time()
        with pytest.raises(StatusError) as expired:
            async for _ in target.client.stream(target.long_request(), timeout_s=0.2):
                pass
        await idle(target, within_s=0.5)
        with pytest.raises(StatusError) as task_expired:
            await served.client.embed(embed_request("deadline"), timeout_s=0.2)
        await asyncio.sleep(0.05)
        registry = served.running.gateway.registry
        assert len(registry) == 0 and registry.recently_finished("deadline")
    assert expired.value.code == task_expired.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert loop.time() - start < 2


async def test_request_ids_are_one_namespace_across_generate_and_tasks() -> None:
    async with serve(**SLOW_TASKS) as served:
        target = served.target
        request = target.long_request()
        call = target.open_call(request)
        await call.first()
        await target.expect_status(
            served.client.embed(embed_request(request.request_id)), grpc.StatusCode.ALREADY_EXISTS, what="Embed"
        )
        duplicate = target.prompt(max_tokens=1)
        duplicate.request_id = request.request_id
        await target.expect_rejected(duplicate, grpc.StatusCode.ALREADY_EXISTS, what="Generate")
        call.cancel()
        embedding = asyncio.ensure_future(served.client.embed(embed_request("shared")))
        await started(served, "shared")
        generate = target.prompt(max_tokens=1)
        generate.request_id = "shared"
        await target.expect_rejected(generate, grpc.StatusCode.ALREADY_EXISTS, what="Generate during Embed")
        await embedding
        (await target.run(generate)).succeeded()  # a finished id may be used again


class WithoutAbort(MockBackend):
    """A mock that declares it cannot abort (as some engines do)."""

    async def start(self) -> EngineFacts:
        facts = await super().start()
        facts.supports_abort = False
        return facts


async def test_an_engine_without_abort_answers_unimplemented() -> None:
    async with serve_backends([("model", WithoutAbort(mock().settings))]) as running:
        for request in (
            pb.AbortRequest(request_id="any"),
            pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="any")),
            pb.AbortRequest(all_requests=pb.AllRequests()),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as unsupported:
                await running.stub.Abort(request)
            assert unsupported.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.aio.AioRpcError) as untargeted:
            await running.stub.Abort(pb.AbortRequest())
    assert untargeted.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_cancelling_a_queued_request_removes_it_from_the_queue() -> None:
    async with serve(max_running_requests=1) as served:
        target = served.target
        running = target.open_call(target.long_request())
        await running.first()
        queued = target.open_call(target.long_request())
        for _ in range(100):
            if (await served.client.load()).queued_requests == 1:
                break
            await asyncio.sleep(0.01)
        queued.cancel()
        await asyncio.sleep(0.1)
        load = await served.client.load()
        running.cancel()
        await idle(target, within_s=0.5)
    assert (load.running_requests, load.queued_requests) == (1, 0)
