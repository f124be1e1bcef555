"""The remote's KV event messages survive the trip through the SPI's values unchanged."""

from __future__ import annotations

from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto, kv_source_to_proto
from openengine_gateway.spi.wire import kv_batch, kv_source

SESSION = pb.KvSessionRef(
    session_id="s1",
    transfer_backend="nixl",
    endpoints=[pb.KvEndpoint(host="10.0.0.1", port=7000, protocol="ucx")],
    dp_rank=1,
)
SESSION.attributes_struct.update({"room": 5.0, "engine": "x"})


def full_batch() -> pb.KvEventBatch:
    """Every field of every event kind set."""
    stored = pb.BlockStored(
        block_hashes=[
            pb.KvBlockHash(value=b"\x01" * 8, encoding="int64"),
            pb.KvBlockHash(value=b"h", encoding="bytes"),
        ],
        parent_block_hash=pb.KvBlockHash(value=b"\x00" * 8, encoding="int64"),
        token_ids=[1, 2, 3, 4],
        block_size=2,
        lora_id=7,
        lora_name="ad",
        medium=pb.STORAGE_MEDIUM_CPU_PINNED,
        extra_keys=[pb.OpaqueKeyTuple(values=["ad", "salt"]), pb.OpaqueKeyTuple()],
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=128,
    )
    removed = pb.BlockRemoved(
        block_hashes=[pb.KvBlockHash(value=b"h", encoding="bytes")], medium=pb.STORAGE_MEDIUM_DISK, group_idx=2
    )
    return pb.KvEventBatch(
        sequence_number=9,
        timestamp_unix_nanos=123,
        data_parallel_rank=3,
        events=[
            pb.KvEvent(request_id="r1", kv_session=SESSION, block_stored=stored),
            pb.KvEvent(block_removed=removed),
            pb.KvEvent(request_id="r2", all_blocks_cleared=pb.AllBlocksCleared()),
            pb.KvEvent(block_stored=pb.BlockStored(block_hashes=[pb.KvBlockHash(value=b"z")])),
        ],
    )


def test_a_batch_is_forwarded_as_it_was_received() -> None:
    received = full_batch()
    assert kv_batch_to_proto(kv_batch(received)) == received
    assert not kv_batch_to_proto(kv_batch(received)).events[3].block_stored.HasField("parent_block_hash")


def test_an_event_without_a_kind_is_not_forwarded() -> None:
    received = pb.KvEventBatch(events=[pb.KvEvent(request_id="r"), pb.KvEvent(all_blocks_cleared={})])
    assert [e.WhichOneof("event") for e in kv_batch_to_proto(kv_batch(received)).events] == ["all_blocks_cleared"]


def test_a_source_keeps_what_is_set_and_what_is_not() -> None:
    full = pb.KvEventSource(
        transport="zmq",
        endpoint_addr=pb.KvEndpoint(host="*", port=5557, protocol="tcp"),
        topic="kv",
        replay_endpoint="tcp://*:5558",
        data_parallel_rank=0,
        encoding="msgpack",
        schema_version=0,
        buffer_steps=10,
        hwm=0,
        max_queue_size=5,
    )
    sparse = pb.KvEventSource(transport="grpc", topic="t")
    for listed in (full, sparse):
        assert kv_source_to_proto(kv_source(listed)) == listed
    assert kv_source(full).hwm == 0 and kv_source(sparse).hwm is None
    assert not kv_source_to_proto(kv_source(sparse)).HasField("endpoint_addr")
