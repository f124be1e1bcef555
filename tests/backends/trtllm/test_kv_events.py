"""TensorRT-LLM's KV event dicts → KvEventBatch: int64 hashes, partial blocks withheld.

Batches are compared in the wire form the gateway sends them in (``contract.kv_wire``)."""

from __future__ import annotations

from typing import Any

from openengine_backends.trtllm.kv_events import KvEventMapper
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto
from openengine_gateway.spi import BlockHash

BIG = 2**64 - 5  # an unsigned hash above 2**63: -5 as an int64


def int64_hash(value: int) -> pb.KvBlockHash:
    """A block hash as the gateway sends it."""
    spi_hash = BlockHash.of(value)
    return pb.KvBlockHash(value=spi_hash.value, encoding=spi_hash.encoding)


def mapped(mapper: KvEventMapper, event: dict[str, Any], *, timestamp_ns: int) -> pb.KvEventBatch | None:
    """The mapper's batch for ``event`` as the gateway sends it."""
    batch = mapper.batch(event, timestamp_ns=timestamp_ns)
    return None if batch is None else kv_batch_to_proto(batch)


def block(block_hash: int, tokens: list[int], level: int = 0) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": block_hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
        "cache_level": level,
        "priority": 35,
    }


def stored(parent: int | None, *blocks: dict[str, Any], rank: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"event_id": 3, "data": {"type": "stored", "parent_hash": parent, "blocks": list(blocks)}}
    if rank is not None:
        event["attention_dp_rank"] = rank
    return event


def removed(*hashes: int) -> dict[str, Any]:
    return {"event_id": 4, "data": {"type": "removed", "block_hashes": list(hashes)}, "window_size": 64}


def test_hashes_are_signed_int64_big_endian() -> None:
    assert int64_hash(BIG) == pb.KvBlockHash(value=(-5).to_bytes(8, "big", signed=True), encoding="int64")
    assert int64_hash(1).value == b"\x00" * 7 + b"\x01"
    assert int64_hash(-5) == int64_hash(BIG)


def test_full_blocks_are_stored_with_their_parent_tokens_and_medium() -> None:
    mapper = KvEventMapper(tokens_per_block=2)
    batch = mapped(mapper, stored(BIG, block(11, [1, 2]), block(12, [3, 4], level=0), rank=1), timestamp_ns=7)
    assert batch is not None and batch.data_parallel_rank == 1 and batch.timestamp_unix_nanos == 7
    (event,) = batch.events
    assert list(event.block_stored.block_hashes) == [int64_hash(11), int64_hash(12)]
    assert event.block_stored.parent_block_hash == int64_hash(BIG)
    assert list(event.block_stored.token_ids) == [1, 2, 3, 4] and event.block_stored.block_size == 2
    assert event.block_stored.medium == pb.STORAGE_MEDIUM_GPU and batch.sequence_number == 0
    host = mapped(mapper, stored(None, block(13, [5, 6], level=1)), timestamp_ns=8)
    assert host is not None and host.events[0].block_stored.medium == pb.STORAGE_MEDIUM_CPU_PINNED
    assert not host.events[0].block_stored.HasField("parent_block_hash")


def test_a_partial_block_is_withheld_and_so_is_its_removal() -> None:
    mapper = KvEventMapper(tokens_per_block=2)
    batch = mapped(mapper, stored(None, block(21, [1, 2]), block(22, [3])), timestamp_ns=1)
    assert batch is not None and list(batch.events[0].block_stored.block_hashes) == [int64_hash(21)]
    assert mapped(mapper, stored(21, block(23, [4])), timestamp_ns=2) is None
    gone = mapped(mapper, removed(22, 21, 23), timestamp_ns=3)
    assert gone is not None and list(gone.events[0].block_removed.block_hashes) == [int64_hash(21)]
    assert mapped(mapper, removed(22), timestamp_ns=4) is not None  # withheld once: announced if seen again


def test_created_and_updated_events_have_nothing_to_announce() -> None:
    mapper = KvEventMapper(tokens_per_block=None)
    created = {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [10, 0]}}
    updated = {"event_id": 1, "data": {"type": "updated", "block_hash": 1, "cache_level": {}, "priority": {}}}
    assert mapped(mapper, created, timestamp_ns=0) is None and mapped(mapper, updated, timestamp_ns=0) is None
    unknown_size = mapped(mapper, stored(None, block(31, [1, 2, 3])), timestamp_ns=0)
    assert unknown_size is not None and unknown_size.events[0].block_stored.block_size == 3
