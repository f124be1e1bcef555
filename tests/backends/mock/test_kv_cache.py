"""The block manager: prefix cache keys, reference counts, LRU eviction and the events it records."""

from __future__ import annotations

import hashlib

from openengine_backends.mock.kv_cache import BlockManager, BlockTable, CacheKey, block_hash
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_event_to_proto
from openengine_gateway.spi import BlockHash

KEY = CacheKey()


def taken(manager: BlockManager) -> list[pb.KvEvent]:
    """The events the manager recorded, as the gateway sends them."""
    return [kv_event_to_proto(event) for event in manager.take_events()]


def filled(manager: BlockManager, tokens: list[int], key: CacheKey = KEY, request_id: str = "r") -> BlockTable:
    """A table that computed all of ``tokens``."""
    table = BlockTable()
    hits = manager.lookup(tokens, key, len(tokens))
    manager.take(table, hits)
    assert manager.grow(table, len(tokens))
    manager.commit(table, tokens, len(tokens), key, request_id)
    return table


def test_chained_hashes_are_stored_with_one_event() -> None:
    manager = BlockManager(8, 4)
    tokens = list(range(10))
    table = filled(manager, tokens)
    first = block_hash(KEY.root, tokens[:4])
    second = block_hash(first, tokens[4:8])
    assert table.hashes == [first, second]
    (event,) = taken(manager)
    stored = event.block_stored
    assert [h.value for h in stored.block_hashes] == [BlockHash.of(first).value, BlockHash.of(second).value]
    assert stored.block_hashes[0].encoding == "int64" and len(stored.block_hashes[0].value) == 8
    assert not stored.HasField("parent_block_hash")
    assert list(stored.token_ids) == tokens[:8]
    assert (stored.block_size, stored.medium, event.request_id) == (4, pb.STORAGE_MEDIUM_GPU, "r")
    assert manager.used == 3 and manager.cached == 2


def test_lookup_finds_the_longest_cached_prefix_within_the_limit() -> None:
    manager = BlockManager(8, 4)
    manager.release(filled(manager, list(range(12))))
    assert len(manager.lookup(list(range(12)), KEY, 12)) == 3
    assert len(manager.lookup(list(range(12)), KEY, 11)) == 2
    assert len(manager.lookup([0, 1, 2, 3, 9, 9, 9, 9], KEY, 8)) == 1
    assert manager.lookup(list(range(12)), CacheKey(salt="s"), 12) == []
    assert manager.lookup(list(range(12)), CacheKey(lora_id=3, lora_name="a"), 12) == []


def test_reference_counts_and_capacity_with_idle_hits() -> None:
    manager = BlockManager(4, 4)
    table = filled(manager, list(range(8)))
    manager.release(table)
    assert (manager.used, manager.free) == (0, 4)
    hits = manager.lookup(list(range(8)), KEY, 8)
    assert manager.available(hits) == 2  # the two idle hits stop being allocatable once taken
    reused = BlockTable()
    manager.take(reused, hits)
    fork = manager.fork(reused, 6)
    assert fork.blocks[0] is reused.blocks[0] and reused.blocks[0].ref_count == 2
    assert len(fork.blocks) == 2 and fork.blocks[1] is not reused.blocks[1]
    assert manager.used == 3


def test_eviction_is_lru_tail_first_and_recorded() -> None:
    manager = BlockManager(3, 2)
    old = filled(manager, [1, 2, 3, 4, 5, 6], request_id="old")
    hashes = list(old.hashes)
    manager.release(old)
    taken(manager)
    assert not manager.grow(BlockTable(), 8)  # more than exists: nothing is taken
    table = BlockTable()
    assert manager.grow(table, 2)
    (removed,) = taken(manager)
    assert [h.value for h in removed.block_removed.block_hashes] == [BlockHash.of(hashes[2]).value]
    assert removed.block_removed.medium == pb.STORAGE_MEDIUM_GPU
    assert len(manager.lookup([1, 2, 3, 4, 5, 6], KEY, 6)) == 2


def test_duplicate_blocks_are_not_cached_twice() -> None:
    manager = BlockManager(8, 2)
    filled(manager, [1, 2])
    taken(manager)
    twin = BlockTable()
    manager.grow(twin, 2)
    manager.commit(twin, [1, 2], 2, KEY, "twin")
    assert taken(manager) == [] and manager.cached == 1
    assert twin.blocks[0].block_hash is None


def test_drop_lora_and_clear() -> None:
    manager = BlockManager(8, 2)
    adapter = CacheKey(lora_id=5, lora_name="five")
    manager.release(filled(manager, [1, 2, 3, 4], key=adapter))
    kept = filled(manager, [1, 2])
    events = taken(manager)
    assert events[0].block_stored.lora_id == 5 and events[0].block_stored.lora_name == "five"
    manager.drop_lora(5)
    (removed,) = taken(manager)
    assert len(removed.block_removed.block_hashes) == 2
    assert manager.lookup([1, 2, 3, 4], adapter, 4) == [] and manager.cached == 1
    manager.release(kept)
    manager.clear()
    assert taken(manager)[-1].WhichOneof("event") == "all_blocks_cleared"
    assert (manager.cached, manager.free) == (0, 8)


def test_block_hash_layout() -> None:
    # the hashes are on the wire (KV events): blake2b-64 of the parent as a big-endian int64,
    # then each token as a big-endian uint32
    payload = (-3).to_bytes(8, "big", signed=True) + b"".join(t.to_bytes(4, "big") for t in (1, 257, 0))
    expected = int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big", signed=True)
    assert block_hash(-3, [1, 257, 0]) == expected


def test_without_events_the_cache_works_the_same_and_records_nothing() -> None:
    quiet, loud = BlockManager(4, 4, record_events=False), BlockManager(4, 4)
    for manager in (quiet, loud):
        for start in (0, 100, 200):  # the third sequence evicts the first one's blocks
            manager.release(filled(manager, list(range(start, start + 8))))
    assert taken(quiet) == []
    kinds = [e.WhichOneof("event") for e in taken(loud)]
    assert kinds == ["block_stored", "block_stored", "block_removed", "block_stored"]
    assert (quiet.cached, quiet.free) == (loud.cached, loud.free) == (4, 4)
    assert [len(quiet.lookup(list(range(s, s + 8)), KEY, 8)) for s in (0, 100, 200)] == [0, 2, 2]
    quiet.clear()
    assert taken(quiet) == [] and quiet.cached == 0


def test_another_adapter_reusing_an_id_never_meets_its_blocks() -> None:
    """Ids are the caller's: once "a" is unloaded, "b" may load under its id while a request of "a" still caches."""
    assert CacheKey(lora_id=7, lora_name="a").root != CacheKey(lora_id=7, lora_name="b").root
    assert CacheKey(lora_id=7, lora_name="a").root == CacheKey(lora_id=7, lora_name="a").root
