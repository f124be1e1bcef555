"""Runtime events over gRPC: type filters, and a slow subscriber's one terminal error."""

from __future__ import annotations

import asyncio

import grpc
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions

from .conftest import serve


async def test_subscribers_get_the_types_they_asked_for() -> None:
    async with serve() as served:
        queue = served.running.stub.SubscribeRuntimeEvents(
            pb.SubscribeRuntimeEventsRequest(types=[pb.RUNTIME_EVENT_TYPE_QUEUE])
        )
        every = served.running.stub.SubscribeRuntimeEvents(pb.SubscribeRuntimeEventsRequest())
        await asyncio.sleep(0.05)  # both subscriptions are open
        await served.target.run(served.target.prompt(max_tokens=3))
        queued = [(await asyncio.wait_for(queue.read(), 5)).runtime_event for _ in range(2)]
        kinds = {(await asyncio.wait_for(every.read(), 5)).runtime_event.type for _ in range(4)}
        queue.cancel()
        every.cancel()
    assert {e.type for e in queued} == {pb.RUNTIME_EVENT_TYPE_QUEUE}
    assert all(e.event_id and e.timestamp_unix_nanos for e in queued)
    assert len(kinds) > 1


async def test_a_slow_runtime_subscriber_ends_with_one_retryable_error() -> None:
    async with serve(GatewayOptions(subscriber_queue=4), decode_time_per_step_s=0.0) as served:
        channel = grpc.aio.insecure_channel(
            served.running.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
        )
        slow = pb.OpenEngineStub(channel).SubscribeRuntimeEvents(pb.SubscribeRuntimeEventsRequest())
        await asyncio.sleep(0.05)
        for _ in range(60):
            await served.target.run(served.target.prompt(max_tokens=8))
        responses = []
        while (response := await asyncio.wait_for(slow.read(), 5)) is not grpc.aio.EOF:
            responses.append(response)
        code = await slow.code()
        await channel.close()
    kinds = [r.WhichOneof("event") for r in responses]
    assert kinds.count("error") == 1 and kinds[-1] == "error" and code == grpc.StatusCode.OK
    assert responses[-1].error.code == pb.ERROR_CODE_OVERLOADED and responses[-1].error.retryable
