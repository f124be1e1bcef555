"""``remote.events``: exactly-once KV relay across reconnects, and the ``auto`` probe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from openengine_backends.remote.events import Backoff, KvCursor, publishes
from openengine_gateway import pb
from openengine_gateway.client import StatusError


def batch(rank: int, number: int, *kinds: str) -> pb.KvEventBatch:
    events = [pb.KvEvent(**{kind: {}}) for kind in kinds]  # type: ignore[arg-type]
    return pb.KvEventBatch(data_parallel_rank=rank, sequence_number=number, events=events)


def kinds(accepted: pb.KvEventBatch | None) -> list[str] | None:
    return None if accepted is None else [e.WhichOneof("event") or "" for e in accepted.events]


def test_first_subscription_is_a_snapshot_then_a_replay_after_the_last_delivered() -> None:
    cursor = KvCursor()
    assert cursor.request("i1") == pb.SubscribeKvEventsRequest(include_snapshot=True)
    assert cursor.accept(batch(0, 0)) is None  # an empty first snapshot says nothing
    assert kinds(cursor.accept(batch(1, 4, "block_stored"))) == ["block_stored"]  # rank 1's snapshot
    assert kinds(cursor.accept(batch(0, 1, "block_stored"))) == ["block_stored"]
    assert kinds(cursor.accept(batch(1, 5, "block_removed"))) == ["block_removed"]
    # reconnect to the same remote: replay from the lowest next number, drop what was delivered
    assert cursor.request("i1") == pb.SubscribeKvEventsRequest(start_sequence_number=2)
    assert cursor.accept(batch(1, 5, "block_removed")) is None
    assert kinds(cursor.accept(batch(0, 2, "block_stored"))) == ["block_stored"]
    assert cursor.last == {0: 2, 1: 5}


def test_a_restarted_remote_is_resynchronised_from_a_snapshot() -> None:
    cursor = KvCursor()
    cursor.request("i1")
    cursor.accept(batch(0, 3, "block_stored"))
    assert cursor.request("i2") == pb.SubscribeKvEventsRequest(include_snapshot=True)
    # the new snapshot replaces what the front knew of rank 0, even though its number went back
    assert kinds(cursor.accept(batch(0, 1, "block_stored"))) == ["all_blocks_cleared", "block_stored"]
    assert kinds(cursor.accept(batch(0, 2, "block_removed"))) == ["block_removed"]


def test_an_evicted_replay_falls_back_to_a_snapshot() -> None:
    cursor = KvCursor()
    cursor.request("i1")
    cursor.accept(batch(0, 3, "block_stored"))
    cursor.resync()
    assert cursor.request("i1") == pb.SubscribeKvEventsRequest(include_snapshot=True)
    assert kinds(cursor.accept(batch(0, 90))) == ["all_blocks_cleared"]  # everything was removed meanwhile


async def test_backoff_doubles_and_resets() -> None:
    backoff = Backoff(0.001)
    for _ in range(6):
        await backoff.wait()
    assert backoff.delay_s == 0.016  # capped at 16 times the first
    backoff.reset()
    assert backoff.delay_s == 0.001


async def test_publishes_asks_once_and_closes_the_stream() -> None:
    closed: list[str] = []

    async def stream(outcome: str) -> AsyncIterator[int]:
        try:
            if outcome == "refused":
                raise StatusError(grpc.StatusCode.UNIMPLEMENTED, "no events here")
            if outcome == "quiet":
                await asyncio.Event().wait()
            yield 1
        finally:
            closed.append(outcome)

    assert await publishes(stream("message"), 1) is True
    assert await publishes(stream("quiet"), 0.01) is True  # accepted, nothing to say yet
    assert await publishes(stream("refused"), 1) is False
    assert sorted(closed) == ["message", "quiet", "refused"]
