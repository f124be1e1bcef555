"""The SPI's KV event values: block hashes, their one encoding into messages, and their guide."""

from __future__ import annotations

import re
from pathlib import Path

from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto
from openengine_gateway.spi import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    kv_events,
    zmq_kv,
)

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md").read_text()


def test_block_hashes_are_bytes_or_64_bit_ints() -> None:
    assert BlockHash.of(b"\x01" * 32) == BlockHash(b"\x01" * 32, "bytes")
    assert BlockHash.of(-5) == BlockHash((-5).to_bytes(8, "big", signed=True), "int64")
    assert BlockHash.of(2**64 - 5) == BlockHash.of(-5), "an unsigned hash above 2**63 is the same int64"
    assert BlockHash.of(1).value == b"\x00" * 7 + b"\x01"


def test_a_batch_is_encoded_under_the_endpoint_rank_with_absent_parents_absent() -> None:
    batch = KvEventBatch(
        events=[
            BlockStored(block_hashes=[BlockHash.of(1)], token_ids=[1, 2], block_size=2, request_id="r"),
            BlockRemoved(block_hashes=[BlockHash.of(1)], medium=pb.STORAGE_MEDIUM_GPU),
            AllBlocksCleared(),
        ],
        data_parallel_rank=1,
        sequence_number=4,
    )
    message = kv_batch_to_proto(batch, 3)
    assert (message.data_parallel_rank, message.sequence_number, message.timestamp_unix_nanos) == (3, 4, 0)
    stored, removed, cleared = message.events
    assert stored.request_id == "r" and not stored.HasField("kv_session")
    assert not stored.block_stored.HasField("parent_block_hash") and list(stored.block_stored.token_ids) == [1, 2]
    assert removed.block_removed.medium == pb.STORAGE_MEDIUM_GPU
    assert cleared.WhichOneof("event") == "all_blocks_cleared"
    assert kv_batch_to_proto(batch).data_parallel_rank == 1


def test_the_guide_names_every_kv_event_value_and_zmq_helper() -> None:
    section = GUIDE.split("## KV events", 1)[1].split("\n## ", 1)[0]
    names = [*kv_events.__all__, "subscribe", "repair_gaps", "zmq_source"]
    assert [name for name in names if not re.search(rf"\b{name}\b", section)] == []
    assert set(zmq_kv.__all__) >= {"subscribe", "repair_gaps", "zmq_source"}
