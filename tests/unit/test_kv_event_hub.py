"""``core.kv_event_hub.KvEventHub``: sequencing, replay, snapshots and bounded fan-out."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.core.kv_event_hub import KvEventHub
from openengine_gateway.errors import EngineFailure, InvalidArgument, OutOfRange

from tests.fakes import ready

GPU = pb.STORAGE_MEDIUM_GPU
CPU = pb.STORAGE_MEDIUM_CPU_PINNED


def h(value: int) -> pb.KvBlockHash:
    return pb.KvBlockHash(value=value.to_bytes(8, "big"), encoding="int64")


def stored(
    *hashes: int, parent: int | None = None, tokens: list[int] | None = None, size: int = 0, **extra: object
) -> pb.KvEvent:
    block = pb.BlockStored(block_hashes=[h(x) for x in hashes], token_ids=tokens or [], block_size=size, **extra)  # type: ignore[arg-type]
    if parent is not None:
        block.parent_block_hash.CopyFrom(h(parent))
    return pb.KvEvent(request_id="r", block_stored=block)


def removed(*hashes: int, medium: int = GPU, group: int = 0) -> pb.KvEvent:
    return pb.KvEvent(
        block_removed=pb.BlockRemoved(block_hashes=[h(x) for x in hashes], medium=medium, group_idx=group)
    )  # type: ignore[arg-type]


def cleared() -> pb.KvEvent:
    return pb.KvEvent(all_blocks_cleared=pb.AllBlocksCleared())


def batch(sequence: int = 0, rank: int = 0, *events: pb.KvEvent, timestamp: int = 0) -> pb.KvEventBatch:
    return pb.KvEventBatch(
        sequence_number=sequence, data_parallel_rank=rank, events=events, timestamp_unix_nanos=timestamp
    )


def numbers(responses: list[pb.SubscribeKvEventsResponse]) -> list[tuple[int, int]]:
    return [(r.batch.data_parallel_rank, r.batch.sequence_number) for r in responses]


async def published(hub: KvEventHub, *batches: pb.KvEventBatch, ranks: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """The (rank, sequence number) pairs a live subscriber receives for ``batches``."""
    queue = hub.subscribe(ranks, include_snapshot=False, start_sequence_number=0)
    for item in batches:
        hub.publish(item)
    return numbers(await ready(queue))


# -- sequencing ---------------------------------------------------------------------------------


async def test_engine_numbers_are_kept_while_they_increase() -> None:
    assert await published(KvEventHub(), batch(5), batch(6), batch(7)) == [(0, 5), (0, 6), (0, 7)]


async def test_zero_is_numbered_by_the_gateway() -> None:
    assert await published(KvEventHub(), batch(0), batch(0), batch(7), batch(0)) == [(0, 1), (0, 2), (0, 7), (0, 8)]


async def test_backwards_numbers_are_shifted_past_the_last() -> None:
    """An engine that restarts its publisher keeps counting from where the stream was."""
    hub = KvEventHub()
    assert await published(hub, batch(10), batch(11), batch(1), batch(2), batch(2), batch(3)) == [
        (0, 10),
        (0, 11),
        (0, 12),
        (0, 13),
        (0, 14),
        (0, 15),
    ]


async def test_ranks_are_numbered_independently() -> None:
    hub = KvEventHub([0, 1])
    got = await published(hub, batch(0, 0), batch(0, 1), batch(0, 1), batch(0, 0), batch(3, 1))
    assert got == [(0, 1), (1, 1), (1, 2), (0, 2), (1, 3)]


async def test_missing_timestamps_are_stamped() -> None:
    hub = KvEventHub()
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    hub.publish(batch(0))
    hub.publish(batch(0, timestamp=123))
    first, second = await ready(queue)
    assert first.batch.timestamp_unix_nanos > 0
    assert second.batch.timestamp_unix_nanos == 123


async def test_an_unknown_rank_in_a_batch_becomes_known() -> None:
    hub = KvEventHub([0])
    hub.publish(batch(0, 3))
    assert hub.ranks == [0, 3]


# -- replay -------------------------------------------------------------------------------------


async def test_replay_from_start_sequence_then_live() -> None:
    hub = KvEventHub()
    for _ in range(5):
        hub.publish(batch(0))
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=3)
    hub.publish(batch(0))
    assert numbers(await ready(queue)) == [(0, 3), (0, 4), (0, 5), (0, 6)]


async def test_a_gap_is_retryable_only_for_who_can_retry_unchanged() -> None:
    """A replay start within the lost range is evicted by the gap: that subscriber's unchanged
    retry is OUT_OF_RANGE, so its error is not retryable; a live subscriber's is."""
    hub = KvEventHub()
    for number in (10, 11, 12):
        hub.publish(batch(number))
    live = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    replaying = hub.subscribe((), include_snapshot=False, start_sequence_number=11)
    hub.publish(batch(13))
    hub.publish(batch(17))
    live_error, replay_error = (await ready(live))[-1].error, (await ready(replaying))[-1].error
    assert dict(live_error.details)["missing_to"] == dict(replay_error.details)["missing_to"] == 16
    assert live_error.retryable and live_error.HasField("retry_after_ms")
    assert not replay_error.retryable and not replay_error.HasField("retry_after_ms")
    with pytest.raises(OutOfRange):
        hub.subscribe((), include_snapshot=False, start_sequence_number=11)


async def test_start_zero_means_live_only() -> None:
    hub = KvEventHub()
    hub.publish(batch(0))
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    assert await ready(queue) == []
    hub.publish(batch(0))
    assert numbers(await ready(queue)) == [(0, 2)]


async def test_future_start_waits_for_that_number() -> None:
    hub = KvEventHub()
    hub.publish(batch(0))
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=3)
    hub.publish(batch(0))
    hub.publish(batch(0))
    assert numbers(await ready(queue)) == [(0, 3)]


async def test_evicted_start_is_out_of_range() -> None:
    hub = KvEventHub(replay_batches=3)
    for _ in range(5):
        hub.publish(batch(0))
    with pytest.raises(OutOfRange, match="oldest is 3"):
        hub.subscribe((), include_snapshot=False, start_sequence_number=2)
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=3)
    assert numbers(await ready(queue)) == [(0, 3), (0, 4), (0, 5)]
    assert hub.subscriber_count == 1


async def test_replay_memory_is_bounded() -> None:
    hub = KvEventHub(replay_batches=4)
    for _ in range(100):
        hub.publish(batch(0))
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=97)
    assert numbers(await ready(queue)) == [(0, 97), (0, 98), (0, 99), (0, 100)]
    with pytest.raises(OutOfRange):
        hub.subscribe((), include_snapshot=False, start_sequence_number=96)


async def test_a_replay_longer_than_the_queue_is_served_whole_and_the_queue_bounds_what_follows() -> None:
    """Every retained batch can be replayed: the subscriber queue bounds live batches, not the replay."""
    hub = KvEventHub(replay_batches=10, subscriber_queue=2)
    for _ in range(4):
        hub.publish(batch(0))
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=1)
    for _ in range(2):
        hub.publish(batch(0))
    assert numbers(await ready(queue)) == [(0, sequence) for sequence in range(1, 7)]
    for _ in range(3):  # one past the queue, while the subscriber reads nothing
        hub.publish(batch(0))
    *delivered, overflow = await ready(queue)
    assert numbers(delivered) == [(0, 7), (0, 8)] and overflow.error.code == pb.ERROR_CODE_OVERLOADED


# -- ranks ---------------------------------------------------------------------------------------


async def test_rank_filter() -> None:
    hub = KvEventHub([0, 1, 2])
    got = await published(hub, batch(0, 0), batch(0, 1), batch(0, 2), batch(0, 1), ranks=(1, 2))
    assert got == [(1, 1), (2, 1), (1, 2)]


def test_unknown_rank_is_invalid_argument() -> None:
    hub = KvEventHub([0, 1])
    with pytest.raises(InvalidArgument, match=r"\[5\]"):
        hub.subscribe((1, 5), include_snapshot=False, start_sequence_number=0)
    assert hub.subscriber_count == 0


# -- snapshot ------------------------------------------------------------------------------------


async def test_snapshot_of_stored_blocks() -> None:
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1, 2, 3, parent=9, tokens=[10, 11, 20, 21, 30, 31], size=2, medium=GPU)))
    hub.publish(batch(0, 0, stored(4, parent=3, tokens=[40, 41], size=2, medium=GPU, lora_id=7)))
    hub.publish(batch(0, 0, removed(2)))
    queue = hub.subscribe((), include_snapshot=True, start_sequence_number=0)
    (snapshot,) = await ready(queue)
    assert snapshot.batch.sequence_number == 3  # the last batch it reflects
    blocks = [event.block_stored for event in snapshot.batch.events]
    assert [int.from_bytes(b.block_hashes[0].value, "big") for b in blocks] == [1, 3, 4]
    assert all(len(b.block_hashes) == 1 for b in blocks)
    # Parents chain block by block; each block keeps its own tokens and metadata.
    assert [int.from_bytes(b.parent_block_hash.value, "big") for b in blocks] == [9, 2, 3]
    assert [list(b.token_ids) for b in blocks] == [[10, 11], [30, 31], [40, 41]]
    assert [b.lora_id for b in blocks] == [0, 0, 7]
    assert all(b.medium == GPU and b.block_size == 2 for b in blocks)
    assert all(e.request_id == "r" for e in snapshot.batch.events)
    hub.publish(batch(0))
    assert numbers(await ready(queue)) == [(0, 4)]


async def test_snapshot_without_attributable_tokens_drops_them() -> None:
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1, 2, tokens=[1, 2, 3], size=2)))
    hub.publish(batch(0, 0, stored(5, tokens=[1, 2, 3], size=2)))
    (snapshot,) = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    blocks = [event.block_stored for event in snapshot.batch.events]
    assert [list(b.token_ids) for b in blocks] == [[], [], [1, 2, 3]]
    assert not blocks[0].HasField("parent_block_hash")


async def test_snapshot_splits_extra_keys_per_block() -> None:
    """vLLM's extra_keys carry one entry per block: each snapshot block keeps its own."""
    keys = [pb.OpaqueKeyTuple(values=[f"mm-{i}"]) for i in range(3)]
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1, 2, 3, extra_keys=keys)))
    hub.publish(batch(0, 0, stored(7, 8, extra_keys=keys)))  # not attributable: dropped
    hub.publish(batch(0, 0, stored(9, extra_keys=keys[:1])))
    (snapshot,) = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    extra = [[list(k.values) for k in e.block_stored.extra_keys] for e in snapshot.batch.events]
    assert extra == [[["mm-0"]], [["mm-1"]], [["mm-2"]], [], [], [["mm-0"]]]


async def test_snapshot_keys_blocks_by_medium_and_group() -> None:
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1, medium=GPU), stored(1, medium=CPU), stored(1, medium=GPU, group_idx=1)))
    hub.publish(batch(0, 0, removed(1, medium=CPU)))
    (snapshot,) = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    assert [(e.block_stored.medium, e.block_stored.group_idx) for e in snapshot.batch.events] == [(GPU, 0), (GPU, 1)]


async def test_all_blocks_cleared_empties_the_snapshot() -> None:
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1), stored(2)))
    hub.publish(batch(0, 0, cleared(), stored(3)))
    (snapshot,) = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    assert [e.block_stored.block_hashes[0].value for e in snapshot.batch.events] == [h(3).value]


async def test_restored_block_moves_to_the_end() -> None:
    hub = KvEventHub()
    hub.publish(batch(0, 0, stored(1), stored(2), stored(1)))
    (snapshot,) = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    assert [e.block_stored.block_hashes[0].value for e in snapshot.batch.events] == [h(2).value, h(1).value]


async def test_snapshot_per_selected_rank_takes_precedence_over_replay() -> None:
    hub = KvEventHub([0, 1])
    hub.publish(batch(0, 0, stored(1)))
    hub.publish(batch(0, 1, stored(2)))
    hub.publish(batch(0, 1, stored(3)))
    queue = hub.subscribe((1,), include_snapshot=True, start_sequence_number=1)
    (snapshot,) = await ready(queue)
    assert (snapshot.batch.data_parallel_rank, snapshot.batch.sequence_number) == (1, 2)
    assert len(snapshot.batch.events) == 2
    empty = await ready(hub.subscribe((), include_snapshot=True, start_sequence_number=0))
    assert [(r.batch.data_parallel_rank, len(r.batch.events)) for r in empty] == [(0, 1), (1, 2)]


# -- slow subscribers and the end of a stream -----------------------------------------------------


async def test_slow_subscriber_gets_one_terminal_error_after_its_queue() -> None:
    hub = KvEventHub([0, 1], subscriber_queue=3)
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    for rank in (0, 1, 0, 1, 0):
        hub.publish(batch(0, rank))
    assert hub.subscriber_count == 0  # dropped at once: the publisher never waits for it
    hub.publish(batch(0, 0))
    items = await ready(queue)
    assert numbers(items[:3]) == [(0, 1), (1, 1), (0, 2)]
    assert len(items) == 4
    error = items[3].error
    assert items[3].WhichOneof("event") == "error"
    assert error.code == pb.ERROR_CODE_OVERLOADED and error.retryable
    assert error.HasField("retry_after_ms")
    # Where to resume: the next number after what was queued, per rank.
    assert dict(error.details["resume_sequence_numbers"]) == {"0": 3, "1": 2}
    assert await ready(queue) == []  # the stream has ended: nothing after the error


async def test_other_subscribers_are_unaffected_by_a_slow_one() -> None:
    hub = KvEventHub(subscriber_queue=2)
    slow = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    fast = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    delivered: list[tuple[int, int]] = []
    for _ in range(4):
        hub.publish(batch(0))
        delivered += numbers(await ready(fast))
    assert delivered == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert [r.WhichOneof("event") for r in await ready(slow)] == ["batch", "batch", "error"]


async def test_close_ends_every_subscription_with_the_failure() -> None:
    hub = KvEventHub()
    first = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    second = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    hub.publish(batch(0))
    hub.close(EngineFailure(pb.ERROR_CODE_DRAINING, "bye", retryable=True, retry_after_ms=1000))
    assert hub.subscriber_count == 0
    for queue in (first, second):
        items = await ready(queue)
        assert [r.WhichOneof("event") for r in items] == ["batch", "error"]
        assert items[1].error.code == pb.ERROR_CODE_DRAINING
    hub.publish(batch(0))
    assert await ready(first) == []


async def test_unsubscribe() -> None:
    hub = KvEventHub()
    queue = hub.subscribe((), include_snapshot=False, start_sequence_number=0)
    hub.unsubscribe(queue)
    assert hub.subscriber_count == 0
    hub.publish(batch(0))
    assert await ready(queue) == []
