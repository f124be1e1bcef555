"""``core.runtime_event_hub`` and ``core.fanout``: filtered fan-out with bounded queues."""

from __future__ import annotations

import asyncio

import pytest
from openengine_gateway import pb
from openengine_gateway.core.fanout import Subscriber
from openengine_gateway.core.runtime_event_hub import RuntimeEventHub
from openengine_gateway.errors import EngineFailure, InvalidArgument

from tests.fakes import ready

FORWARD = pb.RUNTIME_EVENT_TYPE_FORWARD_PASS
QUEUE = pb.RUNTIME_EVENT_TYPE_QUEUE
TRANSFER = pb.RUNTIME_EVENT_TYPE_TRANSFER


def event(kind: int, event_id: str = "", timestamp: int = 0) -> pb.RuntimeEvent:
    return pb.RuntimeEvent(type=kind, event_id=event_id, timestamp_unix_nanos=timestamp)  # type: ignore[arg-type]


async def test_type_filter_and_all_types() -> None:
    hub = RuntimeEventHub()
    forward_only = hub.subscribe([FORWARD])
    everything = hub.subscribe([])
    for kind in (FORWARD, QUEUE, TRANSFER, FORWARD):
        hub.publish(event(kind))
    assert [r.runtime_event.type for r in await ready(forward_only)] == [FORWARD, FORWARD]
    assert [r.runtime_event.type for r in await ready(everything)] == [FORWARD, QUEUE, TRANSFER, FORWARD]


async def test_ids_and_timestamps_are_stamped_when_missing() -> None:
    hub = RuntimeEventHub()
    queue = hub.subscribe([])
    hub.publish(event(QUEUE))
    hub.publish(event(QUEUE, event_id="engine-7", timestamp=42))
    hub.publish(event(QUEUE))
    first, second, third = (r.runtime_event for r in await ready(queue))
    assert first.event_id and first.timestamp_unix_nanos > 0
    assert (second.event_id, second.timestamp_unix_nanos) == ("engine-7", 42)
    assert third.event_id and third.event_id != first.event_id


@pytest.mark.parametrize("types", [[pb.RUNTIME_EVENT_TYPE_UNSPECIFIED], [FORWARD, 99]])
def test_unknown_or_unspecified_types_are_invalid(types: list[int]) -> None:
    hub = RuntimeEventHub()
    with pytest.raises(InvalidArgument, match="runtime event types"):
        hub.subscribe(types)
    assert hub.subscriber_count == 0


async def test_slow_subscriber_ends_with_one_retryable_error() -> None:
    hub = RuntimeEventHub(subscriber_queue=2)
    slow = hub.subscribe([])
    for _ in range(5):
        hub.publish(event(FORWARD))
    assert hub.subscriber_count == 0
    items = await ready(slow)
    assert [r.WhichOneof("event") for r in items] == ["runtime_event", "runtime_event", "error"]
    assert items[-1].error.code == pb.ERROR_CODE_OVERLOADED and items[-1].error.retryable
    assert await ready(slow) == []


async def test_close_and_unsubscribe() -> None:
    hub = RuntimeEventHub()
    leaving = hub.subscribe([])
    staying = hub.subscribe([])
    hub.unsubscribe(leaving)
    hub.publish(event(FORWARD))
    assert await ready(leaving) == []
    hub.close(EngineFailure(pb.ERROR_CODE_INTERNAL, "engine died", retryable=True))
    items = await ready(staying)
    assert [r.WhichOneof("event") for r in items] == ["runtime_event", "error"]
    assert items[-1].error.message == "engine died"
    assert hub.subscriber_count == 0


# -- Subscriber ----------------------------------------------------------------------------------


def overflow() -> str:
    return "overflow"


async def test_subscriber_capacity_and_single_terminal_item() -> None:
    queue: Subscriber[str] = Subscriber(2, overflow)
    assert queue.offer("a") and queue.offer("b")
    assert not queue.offer("c")
    assert queue.overflowed and queue.closed
    assert not queue.offer("d")
    queue.close("ignored: already closed")
    assert await ready(queue) == ["a", "b", "overflow"]


async def test_subscriber_close_without_a_final_item() -> None:
    queue: Subscriber[str] = Subscriber(2, overflow)
    queue.offer("a")
    queue.close()
    assert not queue.overflowed
    assert await ready(queue) == ["a"]


async def test_subscriber_wakes_a_waiting_reader() -> None:
    queue: Subscriber[str] = Subscriber(2, overflow)
    reader = asyncio.ensure_future(queue.__anext__())
    await asyncio.sleep(0)
    assert not reader.done()
    queue.offer("x")
    assert await asyncio.wait_for(reader, 1) == "x"
    reader = asyncio.ensure_future(queue.__anext__())
    await asyncio.sleep(0)
    queue.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, 1)
