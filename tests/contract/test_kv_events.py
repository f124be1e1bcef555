"""KV events over gRPC: a slow subscriber's terminal error, replay, snapshots, ranks."""

from __future__ import annotations

import asyncio
import secrets

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.client import StatusError
from openengine_gateway.core.gateway import GatewayOptions

from .conftest import Served, serve


async def fill(served: Served, *, blocks: int = 3, rank: int | None = None) -> None:
    """One new prompt of ``blocks`` full KV blocks (16 tokens each), run to its end."""
    request = served.target.prompt(max_tokens=1)
    request.prompt = secrets.token_hex(8 * blocks)  # 16 * blocks bytes, plus BOS
    if rank is not None:
        request.kv.data_parallel_rank = rank
    (await served.target.run(request)).succeeded()


async def subscribe(served: Served, **fields: object) -> tuple[grpc.aio.UnaryStreamCall, pb.KvEventBatch]:
    """A subscription that is live from its first response (the snapshot) on."""
    call = served.running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True, **fields))
    first = await asyncio.wait_for(call.read(), 5)
    return call, first.batch


async def drain(call: grpc.aio.UnaryStreamCall) -> list[pb.SubscribeKvEventsResponse]:
    """Every response left on a stream read with ``read``."""
    responses = []
    while (response := await asyncio.wait_for(call.read(), 5)) is not grpc.aio.EOF:
        responses.append(response)
    return responses


async def take(call: grpc.aio.UnaryStreamCall, count: int) -> list[pb.KvEventBatch]:
    return [(await asyncio.wait_for(call.read(), 5)).batch for _ in range(count)]


async def test_a_slow_subscriber_ends_with_one_retryable_error_after_its_queued_batches() -> None:
    async with serve(GatewayOptions(subscriber_queue=4)) as served:
        channel = grpc.aio.insecure_channel(
            served.running.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
        )
        stub = pb.OpenEngineStub(channel)
        slow = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True))
        await asyncio.wait_for(slow.read(), 5)  # the snapshot: subscribed
        fast, _ = await subscribe(served)
        for _ in range(40):  # the slow subscriber reads nothing meanwhile
            await fill(served, blocks=60)
        fast_batches = await take(fast, 40)
        responses = await drain(slow)  # then it reads what its stream holds
        await channel.close()
        assert await slow.code() == grpc.StatusCode.OK
        kinds = [r.WhichOneof("event") for r in responses]
        assert kinds.count("error") == 1 and kinds[-1] == "error" and 0 < len(kinds) - 1 < 40
        error = responses[-1].error
        assert error.code == pb.ERROR_CODE_OVERLOADED and error.retryable and error.HasField("retry_after_ms")
        numbers = [r.batch.sequence_number for r in responses[:-1]]
        assert numbers == [b.sequence_number for b in fast_batches[: len(numbers)]]  # no gap before the error
        resume = error.details["resume_sequence_numbers"]
        assert int(resume["0"]) == numbers[-1] + 1
        # the fast subscriber, and the hub, are unaffected
        assert served.running.gateway.events.kv.subscriber_count == 1
        fast.cancel()


async def test_replay_from_a_start_sequence_number_repeats_the_retained_batches() -> None:
    async with serve() as served:
        live, snapshot = await subscribe(served)
        assert (snapshot.sequence_number, list(snapshot.events)) == (0, [])
        for _ in range(3):
            await fill(served)
        delivered = await take(live, 3)
        assert [b.sequence_number for b in delivered] == [1, 2, 3]
        assert all(b.timestamp_unix_nanos > 0 and b.data_parallel_rank == 0 for b in delivered)
        replay = served.running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=2))
        assert await take(replay, 2) == delivered[1:]
        await fill(served)  # then the replay continues live, without a gap
        (fourth,) = await take(replay, 1)
        assert fourth == (await take(live, 1))[0] and fourth.sequence_number == 4
        live.cancel()
        replay.cancel()


async def test_a_replay_start_that_was_evicted_is_out_of_range() -> None:
    async with serve(GatewayOptions(kv_replay_batches=2)) as served:
        for _ in range(4):
            await fill(served)
        await asyncio.sleep(0.05)  # let the event pump publish them
        with pytest.raises(StatusError) as evicted:
            async for _ in served.client.kv_events(pb.SubscribeKvEventsRequest(start_sequence_number=1)):
                pass
        assert evicted.value.code == grpc.StatusCode.OUT_OF_RANGE
        call = served.running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=3))
        assert [b.sequence_number for b in await take(call, 2)] == [3, 4]
        call.cancel()


async def test_a_snapshot_holds_the_stored_blocks_and_live_batches_follow_it() -> None:
    async with serve(total_kv_blocks=128) as served:
        for _ in range(2):
            await fill(served, blocks=3)
        await asyncio.sleep(0.05)
        call, snapshot = await subscribe(served)
        stored = [e.block_stored for e in snapshot.events]
        assert snapshot.sequence_number == 2 and len(stored) == 6
        assert all(len(s.block_hashes) == 1 and len(s.token_ids) == 16 for s in stored)
        await fill(served, blocks=3)
        (batch,) = await take(call, 1)
        assert batch.sequence_number == 3
        call.cancel()


async def test_ranks_are_numbered_and_filtered_independently() -> None:
    async with serve(data_parallel_size=2) as served:
        one, snapshot = await subscribe(served, data_parallel_ranks=[1])
        assert snapshot.data_parallel_rank == 1
        await fill(served, rank=0)
        await fill(served, rank=1)
        await fill(served, rank=1)
        batches = await take(one, 2)
        assert [(b.data_parallel_rank, b.sequence_number) for b in batches] == [(1, 1), (1, 2)]
        with pytest.raises(StatusError) as unknown:
            async for _ in served.client.kv_events(pb.SubscribeKvEventsRequest(data_parallel_ranks=[7])):
                pass
        assert unknown.value.code == grpc.StatusCode.INVALID_ARGUMENT
        one.cancel()
