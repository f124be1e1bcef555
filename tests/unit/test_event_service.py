"""``core.events.EventService``: engine event pumps feeding the KV and runtime hubs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_gateway import pb
from openengine_gateway.core.background import BackgroundTasks
from openengine_gateway.core.events import EventService
from openengine_gateway.errors import InvalidArgument, ResourceExhausted, Unavailable, Unimplemented
from openengine_gateway.spi import KvEventBatch

from tests.fakes import FakeBackend, engine_set


async def take(stream: AsyncIterator[Any], count: int) -> list[Any]:
    return [await asyncio.wait_for(anext(stream), 1) for _ in range(count)]


async def test_ranks_come_from_parallelism() -> None:
    backend = FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2, data_parallel_start_rank=4))
    events = EventService(engine_set(backend), BackgroundTasks())
    assert events.kv.ranks == [4, 5]
    assert EventService(engine_set(FakeBackend()), BackgroundTasks()).kv.ranks == [0]  # unreported: one rank


async def test_several_engines_publish_on_their_own_ranks() -> None:
    first = FakeBackend(publishes_kv_events=True, parallelism=pb.ParallelismInfo(data_parallel_size=2))
    second = FakeBackend(publishes_kv_events=True, publishes_runtime_events=True)
    background = BackgroundTasks()
    events = EventService(engine_set((first, "a"), (second, "b")), background)
    assert events.kv.ranks == [0, 1, 2]
    events.start()
    kv = events.subscribe_kv(pb.SubscribeKvEventsRequest())
    runtime = events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest())
    waiters = asyncio.ensure_future(anext(kv)), asyncio.ensure_future(anext(runtime))
    await asyncio.sleep(0)
    first.kv_queue.put_nowait(KvEventBatch(sequence_number=7, data_parallel_rank=1))
    second.kv_queue.put_nowait(KvEventBatch(sequence_number=7, data_parallel_rank=0))
    second.runtime_queue.put_nowait(pb.RuntimeEvent(type=pb.RUNTIME_EVENT_TYPE_BATCH, attributes={"model": "x"}))
    batches = [(await asyncio.wait_for(waiters[0], 1)).batch, *(r.batch for r in await take(kv, 1))]
    # both engines numbered their batch 7; on distinct endpoint ranks both numbers stay as sent
    assert [(b.data_parallel_rank, b.sequence_number) for b in batches] == [(1, 7), (2, 7)]
    event = (await asyncio.wait_for(waiters[1], 1)).runtime_event
    assert event.attributes["model"] == "b"  # the gateway attributes the engine
    second.kv_queue.put_nowait(KvEventBatch(data_parallel_rank=1))  # a rank "b" never advertised
    (error,) = await take(kv, 1)
    assert error.error.code == pb.ERROR_CODE_INTERNAL and "advertises ranks 0..0" in error.error.message
    background.cancel_all()


async def test_subscriptions_need_a_publishing_engine() -> None:
    events = EventService(engine_set(FakeBackend()), BackgroundTasks())
    with pytest.raises(Unimplemented, match="KV events"):
        await anext(events.subscribe_kv(pb.SubscribeKvEventsRequest()))
    with pytest.raises(Unimplemented, match="runtime events"):
        await anext(events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest()))


async def test_kv_events_flow_from_the_engine_to_subscribers() -> None:
    backend = FakeBackend(publishes_kv_events=True)
    background = BackgroundTasks()
    events = EventService(engine_set(backend), background)
    events.start()
    stream = events.subscribe_kv(pb.SubscribeKvEventsRequest())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert events.kv.subscriber_count == 1
    backend.kv_queue.put_nowait(KvEventBatch(sequence_number=0))
    backend.kv_queue.put_nowait(KvEventBatch(sequence_number=0))
    first = await asyncio.wait_for(waiter, 1)
    (second,) = await take(stream, 1)
    assert [first.batch.sequence_number, second.batch.sequence_number] == [1, 2]
    await stream.aclose()
    assert events.kv.subscriber_count == 0  # a client that leaves is forgotten
    with pytest.raises(InvalidArgument):
        await anext(events.subscribe_kv(pb.SubscribeKvEventsRequest(data_parallel_ranks=[7])))
    background.cancel_all()


async def test_a_dead_source_ends_subscribers_with_an_error_no_retry_mends() -> None:
    """Not retryable: the unchanged subscription is refused until the gateway restarts."""
    backend = FakeBackend(publishes_kv_events=True, publishes_runtime_events=True)
    background = BackgroundTasks()
    events = EventService(engine_set(backend), background)
    events.start()
    kv = events.subscribe_kv(pb.SubscribeKvEventsRequest())
    runtime = events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest())
    kv_waiter, runtime_waiter = asyncio.ensure_future(anext(kv)), asyncio.ensure_future(anext(runtime))
    await asyncio.sleep(0)
    backend.runtime_queue.put_nowait(pb.RuntimeEvent(type=pb.RUNTIME_EVENT_TYPE_BATCH))
    backend.kv_queue.put_nowait(RuntimeError("publisher socket closed"))
    backend.runtime_queue.put_nowait(RuntimeError("scheduler gone"))
    kv_error = await asyncio.wait_for(kv_waiter, 1)
    assert kv_error.error.code == pb.ERROR_CODE_INTERNAL and not kv_error.error.retryable
    assert "publisher socket closed" in kv_error.error.message
    assert (await asyncio.wait_for(runtime_waiter, 1)).runtime_event.type == pb.RUNTIME_EVENT_TYPE_BATCH
    (runtime_error,) = await take(runtime, 1)
    assert "scheduler gone" in runtime_error.error.message
    for stream in (kv, runtime):
        with pytest.raises(StopAsyncIteration):  # nothing follows the error; the stream ends (OK)
            await asyncio.wait_for(anext(stream), 1)
    await background.wait(1)
    # Nothing would ever arrive on a new subscription: refused, not left waiting.
    with pytest.raises(Unavailable, match="publisher socket closed; restart the gateway"):
        await anext(events.subscribe_kv(pb.SubscribeKvEventsRequest()))
    with pytest.raises(Unavailable, match="scheduler gone"):
        await anext(events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest()))


async def test_a_source_that_ends_is_a_dead_source() -> None:
    backend = FakeBackend(publishes_kv_events=True)
    backend.kv_queue.put_nowait(None)  # the driver's generator returns
    events = EventService(engine_set(backend), BackgroundTasks())
    subscriber = events.subscribe_kv(pb.SubscribeKvEventsRequest())
    waiter = asyncio.ensure_future(anext(subscriber))
    await asyncio.sleep(0)
    events.start()
    ended = await asyncio.wait_for(waiter, 1)
    assert not ended.error.retryable and "KV events source ended" in ended.error.message
    with pytest.raises(Unavailable):
        await anext(events.subscribe_kv(pb.SubscribeKvEventsRequest()))


async def test_close_ends_subscriptions_as_draining() -> None:
    backend = FakeBackend(publishes_runtime_events=True)
    background = BackgroundTasks()
    events = EventService(engine_set(backend), background)
    events.start()
    stream = events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest(types=[pb.RUNTIME_EVENT_TYPE_QUEUE]))
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    events.close("the gateway is shutting down")
    final = await asyncio.wait_for(waiter, 1)
    assert final.error.code == pb.ERROR_CODE_DRAINING and final.error.retryable
    assert final.error.retry_after_ms == 1000
    background.cancel_all()


async def test_a_subscription_that_fell_behind_counts_against_the_limit_until_its_client_leaves() -> None:
    """Its hub dropped it, but its stream still holds what it buffered: the limit counts open streams."""
    backend = FakeBackend(publishes_kv_events=True, publishes_runtime_events=True)
    events = EventService(engine_set(backend), BackgroundTasks(), subscriber_queue=2, max_subscriptions=1)
    unread = events.subscribe_runtime(pb.SubscribeRuntimeEventsRequest())
    waiter = asyncio.ensure_future(anext(unread))
    await asyncio.sleep(0)
    for _ in range(4):  # nothing reads: the subscriber falls behind and its hub ends it
        events.runtime.publish(pb.RuntimeEvent(type=pb.RUNTIME_EVENT_TYPE_BATCH))
    assert events.runtime.subscriber_count == 0 and events.runtime.dropped_subscribers == 1
    assert events.open_subscriptions == 1
    with pytest.raises(ResourceExhausted, match="limit of 1 event subscriptions"):
        await asyncio.wait_for(anext(events.subscribe_kv(pb.SubscribeKvEventsRequest())), 1)
    await asyncio.wait_for(waiter, 1)
    await unread.aclose()  # the client leaves
    assert events.open_subscriptions == 0
    again = events.subscribe_kv(pb.SubscribeKvEventsRequest(include_snapshot=True))
    assert (await asyncio.wait_for(anext(again), 1)).HasField("batch")
    await again.aclose()
