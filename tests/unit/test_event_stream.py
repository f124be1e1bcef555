"""``spi.events.EventStream``: adaptive coalescing, ordering, and how a stream ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    EventStream,
    GenerationEvent,
    KvSession,
    OutputFinished,
    PrefillDone,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

from tests.fakes import ready


def delta(index: int, *ids: int) -> TokenDelta:
    return TokenDelta(index, [TokenRecord(i) for i in ids], "".join(chr(ord("a") + i % 26) for i in ids))


async def test_unread_deltas_of_one_output_merge() -> None:
    stream = EventStream()
    stream.put(delta(0, 1))
    stream.put(delta(0, 2))
    stream.put(delta(0, 3))
    (merged,) = await ready(stream)
    assert isinstance(merged, TokenDelta)
    assert [t.token_id for t in merged.tokens] == [1, 2, 3]
    assert merged.text == "bcd"


async def test_a_read_delta_is_never_extended() -> None:
    """Coalescing happens only while a delta is unread: an idle stream delivers each at once."""
    stream = EventStream()
    stream.put(delta(0, 1))
    (first,) = await ready(stream)
    stream.put(delta(0, 2))
    (second,) = await ready(stream)
    assert isinstance(first, TokenDelta) and isinstance(second, TokenDelta)
    assert [t.token_id for t in first.tokens] == [1]
    assert [t.token_id for t in second.tokens] == [2]


async def test_outputs_coalesce_separately_and_keep_their_order() -> None:
    stream = EventStream()
    for event in (delta(0, 1), delta(1, 10), delta(0, 2), delta(1, 11)):
        stream.put(event)
    events = await ready(stream)
    assert [(e.index, [t.token_id for t in e.tokens]) for e in events if isinstance(e, TokenDelta)] == [
        (0, [1, 2]),
        (1, [10, 11]),
    ]


async def test_no_merge_across_other_events() -> None:
    """A delta never jumps over a usage report or a finish, so no token follows its output's finish."""
    stream = EventStream()
    stream.put(delta(0, 1))
    stream.put(UsageReport(1, 1))
    stream.put(delta(0, 2))
    stream.put(OutputFinished(1, pb.FINISH_REASON_LENGTH))
    stream.put(delta(0, 3))
    events = await ready(stream)
    kinds = [(type(e).__name__, [t.token_id for t in e.tokens] if isinstance(e, TokenDelta) else None) for e in events]
    assert kinds == [
        ("TokenDelta", [1]),
        ("UsageReport", None),
        ("TokenDelta", [2]),
        ("OutputFinished", None),
        ("TokenDelta", [3]),
    ]


async def test_finish_drains_pending_then_stops() -> None:
    stream = EventStream()
    stream.put(delta(0, 1))
    stream.finish()
    assert stream.closed
    stream.put(delta(0, 2))  # ignored after the producer finished
    events = await ready(stream)
    assert len(events) == 1 and [t.token_id for t in events[0].tokens] == [1]  # type: ignore[union-attr]


async def test_fail_raises_after_pending_events() -> None:
    stream = EventStream()
    stream.put(delta(0, 1))
    failure = EngineFailure(pb.ERROR_CODE_INTERNAL, "boom")
    stream.fail(failure)
    stream.fail(RuntimeError("second failure is ignored"))
    first = await stream.__anext__()
    assert isinstance(first, TokenDelta)
    with pytest.raises(EngineFailure) as raised:
        await stream.__anext__()
    assert raised.value is failure


async def test_fail_after_finish_is_ignored() -> None:
    stream = EventStream()
    stream.finish()
    stream.fail(RuntimeError("late"))
    assert await ready(stream) == []


async def test_cancel_drops_pending_events_but_the_latest_usage() -> None:
    """The final response of an aborted request still counts what it used."""
    stream = EventStream()
    stream.put(UsageReport(1, 0))
    stream.put(delta(0, 1))
    stream.put(UsageReport(1, 1))
    stream.put(delta(0, 2))
    stream.cancel()
    assert stream.cancelled and stream.closed
    assert await ready(stream) == [UsageReport(1, 1)]
    stream.put(delta(0, 3))
    assert await ready(stream) == []


async def test_a_prefill_done_nobody_will_read_is_abandoned() -> None:
    """No client learnt its session's id, so only the core can free the KV it holds."""
    abandoned: list[str] = []
    dropped, late, read = EventStream(), EventStream(), EventStream()
    for stream in (dropped, late, read):
        stream.on_abandoned = lambda session: abandoned.append(session.session_id)
    dropped.put(PrefillDone(KvSession("dropped")))
    dropped.cancel()
    late.cancel()
    late.put(PrefillDone(KvSession("late")))
    read.put(PrefillDone(KvSession("read")))
    assert await ready(dropped) == [] and len(await ready(read)) == 1
    assert abandoned == ["dropped", "late"]


async def test_cancel_after_finish_still_drops_what_is_unread() -> None:
    """An abort wins over events the client has not read yet."""
    stream = EventStream()
    stream.put(delta(0, 1))
    stream.finish()
    stream.cancel()
    assert stream.cancelled and await ready(stream) == []


async def test_cancel_after_fail_ends_as_cancelled() -> None:
    """An abort wins over a failure nobody has read yet: the stream ends, it does not raise."""
    stream = EventStream()
    stream.put(delta(0, 1))
    stream.fail(EngineFailure(pb.ERROR_CODE_INTERNAL, "boom"))
    stream.cancel()
    assert stream.cancelled
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_waiting_consumer_is_woken_by_put() -> None:
    stream = EventStream()
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    assert not reader.done()
    stream.put(delta(0, 7))
    event = await asyncio.wait_for(reader, 1)
    assert isinstance(event, TokenDelta) and [t.token_id for t in event.tokens] == [7]


@pytest.mark.parametrize("end", ["finish", "cancel", "fail"])
async def test_waiting_consumer_is_woken_by_the_end(end: str) -> None:
    stream = EventStream()
    failure = EngineFailure(pb.ERROR_CODE_INTERNAL, "x")
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    if end == "finish":
        stream.finish()
    elif end == "cancel":
        stream.cancel()
    else:
        stream.fail(failure)
    if end == "fail":
        with pytest.raises(EngineFailure):
            await asyncio.wait_for(reader, 1)
    else:
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(reader, 1)


async def test_async_iteration_end_to_end() -> None:
    stream = EventStream()

    async def produce() -> None:
        for i in range(20):
            stream.put(delta(i % 2, i))
            if i % 3 == 0:
                await asyncio.sleep(0)
        stream.finish()

    producer = asyncio.ensure_future(produce())
    seen: dict[int, list[int]] = {0: [], 1: []}
    async for event in stream:
        assert isinstance(event, TokenDelta)
        seen[event.index].extend(t.token_id for t in event.tokens)
    await producer
    assert seen == {0: list(range(0, 20, 2)), 1: list(range(1, 20, 2))}


# A script of producer and consumer steps: ("put", output) or ("read", how many).
steps = st.lists(
    st.one_of(st.tuples(st.just("put"), st.integers(0, 2)), st.tuples(st.just("read"), st.integers(1, 3))),
    max_size=60,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps)
def test_every_token_exactly_once_in_order(script: list[tuple[str, int]]) -> None:
    """Whatever the interleaving, each output's tokens arrive once, in order, and a read
    delta is never merged into again."""
    loop = asyncio.new_event_loop()  # a private loop per example; the session loop is left alone
    try:
        loop.run_until_complete(_run_script(script))
    finally:
        loop.close()


async def _run_script(script: list[tuple[str, int]]) -> None:
    stream = EventStream()
    sent: dict[int, list[int]] = {0: [], 1: [], 2: []}
    received: dict[int, list[int]] = {0: [], 1: [], 2: []}
    delivered: list[tuple[TokenDelta, int]] = []
    next_id = 0

    async def take(limit: int | None) -> None:
        for event in await ready(stream, limit):
            assert isinstance(event, TokenDelta)
            delivered.append((event, len(event.tokens)))
            received[event.index].extend(t.token_id for t in event.tokens)

    for action, value in script:
        if action == "put":
            sent[value].append(next_id)
            stream.put(TokenDelta(value, [TokenRecord(next_id)]))
            next_id += 1
        else:
            await take(value)
    stream.finish()
    await take(None)
    assert received == sent
    assert all(len(event.tokens) == size for event, size in delivered)  # nothing grew after it was read


# -- from_iterator: a driver's async generator, pumped on a task of its own ---------------------


async def test_pump_coalesces_while_the_consumer_lags() -> None:
    async def source() -> AsyncIterator[GenerationEvent]:
        for i in range(5):
            yield delta(0, i)

    stream = EventStream.from_iterator(source())
    await producer(stream)
    (merged,) = await ready(stream)
    assert isinstance(merged, TokenDelta) and [t.token_id for t in merged.tokens] == [0, 1, 2, 3, 4]


async def test_pump_reports_a_failure_after_the_events() -> None:
    async def source() -> AsyncIterator[GenerationEvent]:
        yield delta(0, 1)
        raise EngineFailure(pb.ERROR_CODE_INTERNAL, "boom")

    stream = EventStream.from_iterator(source())
    await producer(stream)
    assert isinstance(await anext(stream), TokenDelta)
    with pytest.raises(EngineFailure, match="boom"):
        await anext(stream)


async def test_detaching_cancels_the_pump_and_the_stream() -> None:
    gate = asyncio.Event()

    async def source() -> AsyncIterator[GenerationEvent]:
        await gate.wait()
        yield delta(0, 1)

    stream = EventStream.from_iterator(source())
    await asyncio.sleep(0)
    stream.detach()
    with pytest.raises(asyncio.CancelledError):
        await producer(stream)
    assert stream.cancelled and await ready(stream) == []


def producer(stream: EventStream) -> asyncio.Task[None]:
    """The task ``from_iterator`` started."""
    assert stream.producer is not None
    return stream.producer
