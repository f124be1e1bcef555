"""vLLM's and SGLang's ZMQ/msgpack KV event batches → ``KvEventBatch``, in every event encoding.

Decoded batches are compared in the wire form the gateway sends them in (``contract.kv_wire``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto
from openengine_gateway.spi import BlockHash, KvEventBatch
from openengine_gateway.spi.zmq_kv import connect_address, decode_batch, subscribe

H1, H2 = b"\x01" * 32, b"\x02" * 32
STORED_FIELDS = {
    "block_hashes": [H2],
    "parent_block_hash": H1,
    "token_ids": [5, 6, 7, 8],
    "block_size": 4,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": "ad",
    "extra_keys": [["ad", "salt"]],
    "group_idx": 1,
    "kv_cache_spec_kind": "full_attention",
}


def decode(payload: bytes, sequence: int, *, default_rank: int = 0) -> pb.KvEventBatch:
    """``decode_batch``'s batch as the gateway sends it."""
    return kv_batch_to_proto(decode_batch(payload, sequence, default_rank=default_rank))


def block_hash(value: bytes | int) -> pb.KvBlockHash:
    """A block hash as the gateway sends it."""
    spi_hash = BlockHash.of(value)
    return pb.KvBlockHash(value=spi_hash.value, encoding=spi_hash.encoding)


def map_form() -> bytes:
    """As vLLM 0.32 encodes: the batch array-like, events tagged maps."""
    events = [
        {"type": "BlockStored", **STORED_FIELDS},
        {"type": "BlockRemoved", "block_hashes": [H1], "medium": "CPU"},
        {"type": "AllBlocksCleared"},
    ]
    return msgpack.packb([1.5, events, 2])


def array_form() -> bytes:
    """As earlier vLLM builds encode: events array-like, tag first, fields in order."""
    stored = ["BlockStored", [H2], H1, [5, 6, 7, 8], 4, None, "GPU", "ad", [["ad", "salt"]], 1, "full_attention"]
    return msgpack.packb([1.5, [stored, ["BlockRemoved", [H1], "CPU"], ["AllBlocksCleared"]], 2])


@pytest.mark.parametrize("payload", [map_form(), array_form()], ids=["map", "array"])
def test_both_encodings_decode_alike(payload: bytes) -> None:
    batch = decode(payload, 0)
    assert batch.sequence_number == 1, "vLLM numbers from 0; zero would ask the gateway to renumber"
    assert batch.timestamp_unix_nanos == 1_500_000_000 and batch.data_parallel_rank == 2
    stored, removed, cleared = batch.events
    assert stored.block_stored == pb.BlockStored(
        block_hashes=[pb.KvBlockHash(value=H2, encoding="bytes")],
        parent_block_hash=pb.KvBlockHash(value=H1, encoding="bytes"),
        token_ids=[5, 6, 7, 8],
        block_size=4,
        lora_name="ad",
        medium=pb.STORAGE_MEDIUM_GPU,
        extra_keys=[pb.OpaqueKeyTuple(values=["ad", "salt"])],
        group_idx=1,
        kv_cache_spec_kind="full_attention",
    )
    assert removed.block_removed.medium == pb.STORAGE_MEDIUM_CPU_PINNED
    assert cleared.HasField("all_blocks_cleared")


def test_sglang_batches_decode_with_their_mediums_and_extra_fields() -> None:
    """As SGLang 0.5.23 encodes (``disaggregation/kv_events.py``): int hashes, ``CPU_PINNED``/``EXTERNAL``
    mediums, ``cache_salt`` and ``session_id`` on ``BlockStored``, and the batch's third element the
    attention-DP rank. The salt namespaces every block of the event: each carries it as its extra key."""
    stored = {
        "type": "BlockStored",
        "block_hashes": [-7, 9],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
        "block_size": 4,
        "lora_id": None,
        "medium": "CPU_PINNED",
        "cache_salt": "tenant",
        "session_id": "s",
        "lora_name": "ad",
    }
    removed = {"type": "BlockRemoved", "block_hashes": [9], "medium": "EXTERNAL"}
    batch = decode(msgpack.packb([2.0, [stored, removed], 1]), 0)
    first, second = batch.events
    assert batch.data_parallel_rank == 1
    assert first.block_stored == pb.BlockStored(
        block_hashes=[block_hash(-7), block_hash(9)],
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        block_size=4,
        lora_name="ad",
        medium=pb.STORAGE_MEDIUM_CPU_PINNED,
        extra_keys=[pb.OpaqueKeyTuple(values=["tenant"])] * 2,
    )
    assert not first.block_stored.HasField("parent_block_hash")
    assert second.block_removed.medium == pb.STORAGE_MEDIUM_EXTERNAL


def test_extra_keys_stay_readable_and_mediums_match_whatever_their_case() -> None:
    """vLLM's ``to_event_extra_keys``: LoRA names and salts, ``(mm_identifier, offset)`` pairs and
    sha256 digests of prompt embeds; a Mooncake store names its medium ``"cpu"``."""
    digest = bytes(range(32))
    stored = {
        "type": "BlockStored",
        "block_hashes": [5],
        "token_ids": [1, 2],
        "block_size": 2,
        "medium": "cpu",
        "extra_keys": [["adapter", ["img-hash", 3], digest]],
    }
    (event,) = decode(msgpack.packb([0.0, [stored], 0]), 0).events
    assert list(event.block_stored.extra_keys[0].values) == ["adapter", '["img-hash",3]', digest.hex()]
    assert event.block_stored.medium == pb.STORAGE_MEDIUM_CPU_PINNED


def test_an_eagle_engine_s_bigram_tokens_decode_as_its_tokens() -> None:
    """SGLang keys an EAGLE engine's radix cache by bigrams; its events carry each position as the
    pair (token, next token) (``mem_cache/events.py``)."""
    stored = {"type": "BlockStored", "block_hashes": [5], "token_ids": [[1, 15043], [15043, 29892]], "block_size": 2}
    (event,) = decode(msgpack.packb([0.0, [stored], 0]), 0).events
    assert list(event.block_stored.token_ids) == [1, 15043]


def test_int_hashes_and_a_missing_rank() -> None:
    assert block_hash(2**63 + 1) == pb.KvBlockHash(value=(2**63 + 1).to_bytes(8, "big"), encoding="int64")
    assert block_hash(-2).value == (-2).to_bytes(8, "big", signed=True)
    batch = decode(msgpack.packb([0.0, [{"type": "AllBlocksCleared"}]]), 41, default_rank=3)
    assert batch.sequence_number == 42 and batch.data_parallel_rank == 3


def test_unknown_events_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown KV event"):
        decode_batch(msgpack.packb([0.0, [{"type": "Mystery"}], 0]), 0)


def test_an_unsalted_sglang_event_has_no_extra_keys() -> None:
    stored = {"type": "BlockStored", "block_hashes": [5], "token_ids": [1, 2], "block_size": 2, "cache_salt": None}
    (event,) = decode(msgpack.packb([0.0, [stored], 0]), 0).events
    assert not event.block_stored.extra_keys


def test_wildcard_endpoints_are_reached_on_loopback() -> None:
    assert connect_address("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert connect_address("tcp://0.0.0.0:5557") == "tcp://127.0.0.1:5557"
    assert connect_address("tcp://[::]:5557") == "tcp://[::1]:5557", "SGLang's describe_local_source"
    assert connect_address("tcp://10.1.2.3:5557") == "tcp://10.1.2.3:5557"
    assert connect_address("ipc:///run/kv.sock") == "ipc:///run/kv.sock"


async def first_batch(publisher: zmq.asyncio.Socket, endpoint: str) -> KvEventBatch:
    """The first batch a subscription to ``endpoint`` decodes while ``publisher`` publishes."""
    batches = subscribe({0: (endpoint, "kv")})
    try:
        first = asyncio.ensure_future(anext(batches))
        for _ in range(100):  # a SUB socket joins asynchronously: publish until it is heard
            await publisher.send_multipart([b"kv", (7).to_bytes(8, "big"), map_form()])
            done, _ = await asyncio.wait({first}, timeout=0.05)
            if done:
                break
        return await first
    finally:
        await batches.aclose()


async def test_subscribe_reads_a_live_publisher() -> None:
    publisher = zmq.asyncio.Context.instance().socket(zmq.PUB)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    try:
        batch = await first_batch(publisher, f"tcp://*:{port}")
    finally:
        publisher.close(linger=0)
    assert batch.sequence_number == 8 and len(batch.events) == 3


@pytest.mark.parametrize("family", ["ipc", "ipv6"])
async def test_subscribe_reads_ipc_and_ipv6_publishers(family: str, tmp_path: Path) -> None:
    """SGLang binds ``ipc://`` paths and, where its socket allows IPv6, bracketed IPv6 hosts."""
    publisher = zmq.asyncio.Context.instance().socket(zmq.PUB)
    if family == "ipc":
        endpoint = f"ipc://{tmp_path / 'kv.sock'}"
        publisher.bind(endpoint)
    else:
        publisher.setsockopt(zmq.IPV6, 1)
        endpoint = f"tcp://[::1]:{publisher.bind_to_random_port('tcp://[::1]')}"
    try:
        batch = await first_batch(publisher, endpoint)
    finally:
        publisher.close(linger=0)
    assert batch.sequence_number == 8
