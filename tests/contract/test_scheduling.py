"""Scheduling and admission over gRPC: priority order, pinned ranks, and capacity exhaustion."""

from __future__ import annotations

import asyncio

import grpc
from openengine_gateway import pb
from openengine_gateway.conformance import OpenCall
from openengine_gateway.core.gateway import GatewayOptions

from .conftest import serve


async def test_a_higher_priority_request_is_admitted_first() -> None:
    async with serve(max_running_requests=1) as served:
        target, loop = served.target, asyncio.get_running_loop()
        running = target.open_call(target.long_request(priority=0))
        await running.first()
        low = target.open_call(target.prompt(max_tokens=20, ignore_eos=True, priority=-1))
        high = target.open_call(target.prompt(max_tokens=20, ignore_eos=True, priority=5))
        for _ in range(100):  # both wait behind the running request
            if (await served.client.load()).queued_requests == 2:
                break
            await asyncio.sleep(0.01)
        await served.client.abort(pb.AbortRequest(request_id=running.request.request_id))

        async def first_token_at(call: OpenCall) -> float:
            await call.first()
            at = loop.time()
            (await call.rest()).succeeded()
            return at

        low_at, high_at = await asyncio.gather(first_token_at(low), first_token_at(high))
        await running.rest()
    assert high_at < low_at


async def test_a_request_pinned_to_a_data_parallel_rank_runs_there() -> None:
    async with serve(data_parallel_size=2) as served:
        target = served.target
        call = target.open_call(target.long_request(data_parallel_rank=1))
        await call.first()
        load = await served.client.load(per_rank=True)
        call.cancel()
        await target.expect_rejected(
            target.prompt(max_tokens=1, data_parallel_rank=2), grpc.StatusCode.INVALID_ARGUMENT, what="rank 2 of 2"
        )
    running = {rank.data_parallel_rank: rank.running_requests for rank in load.ranks}
    assert running == {0: 0, 1: 1} and load.running_requests == 1


async def test_admission_exhaustion_is_resource_exhausted_with_a_retry_hint() -> None:
    async with serve(GatewayOptions(max_in_flight=1)) as served:
        target = served.target
        call = target.open_call(target.long_request())
        await call.first()
        generate = await target.expect_rejected(
            target.prompt(max_tokens=1), grpc.StatusCode.RESOURCE_EXHAUSTED, what="Generate beyond the limit"
        )
        embed = pb.EmbedRequest(context=pb.TaskRequestContext(request_id="e", model="model"))
        embed.inputs.add(item_id="i", text="x")
        task = await target.expect_status(
            served.client.embed(embed), grpc.StatusCode.RESOURCE_EXHAUSTED, what="Embed beyond the limit"
        )
        call.cancel()
    assert generate.retry_after_ms is not None and task.retry_after_ms is not None
