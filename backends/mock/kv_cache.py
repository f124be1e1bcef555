"""The KV block manager: fixed-size blocks, reference counts, and a prefix cache.

A full block whose tokens have been computed is cached under a chained hash
``H(parent hash, block tokens)``; the chain starts from a root that mixes in the LoRA
adapter and the cache salt, so different adapters or salts never share blocks. A request's
leading blocks are looked up before it runs (unless it bypasses the cache; its own new
blocks are still cached). Freed cached blocks stay reusable until evicted, least recently
freed first (a sequence's tail before its head). Every store, eviction and clear is
recorded in order and taken as the SPI's KV events, for the engine to publish per step.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from openengine_gateway import pb
from openengine_gateway.spi import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent


class CacheKey(NamedTuple):
    """What namespaces a request's blocks besides their tokens."""

    lora_id: int = 0
    lora_name: str = ""
    salt: str | None = None

    @property
    def root(self) -> int:
        """The parent hash of a sequence's first block.

        The adapter's name counts as well as its id, as in vLLM: ids are the caller's and may be
        reused by another adapter once one is unloaded, while a request still running with the
        unloaded one keeps caching blocks under its id.
        """
        salt = b"" if self.salt is None else b"\x01" + self.salt.encode("utf-8")
        name = self.lora_name.encode("utf-8")
        lora = self.lora_id.to_bytes(8, "big", signed=True) + len(name).to_bytes(4, "big") + name
        return _digest(b"root" + lora + salt)


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The chained, signed 64-bit hash of one full block: of the parent as a big-endian int64
    followed by each token as a big-endian uint32."""
    return _digest(struct.pack(f">q{len(tokens)}I", parent, *tokens))


@dataclass(eq=False, slots=True)
class Block:
    """One KV block; ``block_hash`` is set while it is in the prefix cache."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    lora_id: int = 0


@dataclass(slots=True)
class _Stored:
    """A chain of stored blocks of one request, still growing while it is the last event recorded."""

    request_id: str
    parent: int | None
    key: CacheKey
    hashes: list[int]
    tokens: list[int]


_Recorded = _Stored | list[int] | None
"""A recorded event: stored blocks, the hashes of removed blocks, or None for a clear."""


@dataclass(slots=True)
class BlockTable:
    """A sequence's blocks, and the chain hashes of its leading full computed blocks."""

    blocks: list[Block] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


class BlockManager:
    """Blocks of one engine rank."""

    def __init__(self, num_blocks: int, block_size: int, *, record_events: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._record = record_events
        """Whether stores, removals and clears are recorded: off when the engine publishes none,
        as recording them costs more than caching the block."""
        self._empty: deque[Block] = deque(Block(i) for i in range(num_blocks))
        self._evictable: OrderedDict[int, Block] = OrderedDict()
        self._cached: dict[int, Block] = {}
        self._events: list[_Recorded] = []

    @property
    def free(self) -> int:
        """Blocks that can be allocated now (never used, or cached but unreferenced)."""
        return len(self._empty) + len(self._evictable)

    @property
    def used(self) -> int:
        """Blocks referenced by sequences or held KV sessions."""
        return self.num_blocks - self.free

    @property
    def cached(self) -> int:
        """Blocks currently in the prefix cache."""
        return len(self._cached)

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def lookup(self, tokens: Sequence[int], key: CacheKey, limit: int) -> list[Block]:
        """Cached blocks of the longest cached prefix of ``tokens[:limit]``, in whole blocks."""
        size = self.block_size
        parent, hits = key.root, []
        for start in range(0, limit - size + 1, size):
            block = self._cached.get(block_hash(parent, tokens[start : start + size]))
            if block is None:
                break
            hits.append(block)
            parent = block.block_hash  # type: ignore[assignment]
        return hits

    def available(self, hits: Sequence[Block] = ()) -> int:
        """Blocks allocatable once ``hits`` (which may be unreferenced cached blocks) are taken."""
        idle_hits = {b.block_id for b in hits if b.ref_count == 0}
        return self.free - len(idle_hits)

    def take(self, table: BlockTable, hits: Sequence[Block]) -> None:
        """Start an empty table with cache ``hits``; take every hit before growing any table,
        so that growth cannot evict a block another sequence is about to reuse."""
        for block in hits:
            self._ref(block)
        table.blocks = list(hits)
        table.hashes = [b.block_hash for b in hits]  # type: ignore[misc]

    def fork(self, source: BlockTable, tokens: int) -> BlockTable:
        """A table sharing ``source``'s full blocks of the first ``tokens``, with its own tail."""
        full = tokens // self.block_size
        for block in source.blocks[:full]:
            self._ref(block)
        table = BlockTable(list(source.blocks[:full]), list(source.hashes[:full]))
        self.grow(table, tokens)
        return table

    def grow(self, table: BlockTable, tokens: int) -> bool:
        """Add blocks until ``table`` holds ``tokens``; False (and nothing added) when short."""
        if tokens <= len(table.blocks) * self.block_size:  # the common case, checked on every token
            return True
        needed = self.blocks_for(tokens) - len(table.blocks)
        if needed > self.free:
            return False
        for _ in range(needed):
            if self._empty:
                block = self._empty.popleft()
            else:
                _, block = self._evictable.popitem(last=False)
                self._uncache(block)
            block.ref_count = 1
            table.blocks.append(block)
        return True

    def release(self, table: BlockTable) -> None:
        """Drop the table's references, tail first so tails are evicted before heads."""
        for block in reversed(table.blocks):
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._empty.append(block)
                else:
                    self._evictable[block.block_id] = block
        table.blocks = []
        table.hashes = []

    def commit(self, table: BlockTable, tokens: Sequence[int], computed: int, key: CacheKey, request_id: str) -> None:
        """Cache every block of ``table`` that ``computed`` tokens have just filled."""
        size = self.block_size
        filled = min(computed // size, len(table.blocks))
        while len(table.hashes) < filled:
            index = len(table.hashes)
            parent = table.hashes[-1] if table.hashes else key.root
            block_tokens = tokens[index * size : (index + 1) * size]
            value = block_hash(parent, block_tokens)
            table.hashes.append(value)
            block = table.blocks[index]
            if block.block_hash is None and value not in self._cached:
                block.block_hash = value
                block.lora_id = key.lora_id
                self._cached[value] = block
                self._stored(value, parent if index else None, block_tokens, key, request_id)

    def drop_lora(self, lora_id: int) -> None:
        """Forget every cached block of an adapter (it is unloaded; its id may be reused)."""
        for block in [b for b in self._cached.values() if b.lora_id == lora_id]:
            self._uncache(block)
            if block.ref_count == 0:
                del self._evictable[block.block_id]
                self._empty.append(block)

    def clear(self) -> None:
        """Empty the cache (an engine restart; no block may be referenced)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        self._evictable.clear()
        self._empty = deque(Block(i) for i in range(self.num_blocks))
        if self._record:
            self._events.append(None)

    def take_events(self) -> list[KvEvent]:
        """The events recorded since the last call, in order."""
        events, self._events = self._events, []
        return [self._event(recorded) for recorded in events]

    def _event(self, recorded: _Recorded) -> KvEvent:
        if recorded is None:
            return AllBlocksCleared()
        if isinstance(recorded, list):
            return BlockRemoved(block_hashes=[BlockHash.of(h) for h in recorded], medium=pb.STORAGE_MEDIUM_GPU)
        key = recorded.key
        return BlockStored(
            block_hashes=[BlockHash.of(h) for h in recorded.hashes],
            token_ids=recorded.tokens,
            parent_block_hash=None if recorded.parent is None else BlockHash.of(recorded.parent),
            block_size=self.block_size,
            lora_id=key.lora_id,
            lora_name=key.lora_name,
            medium=pb.STORAGE_MEDIUM_GPU,
            request_id=recorded.request_id,
        )

    def _ref(self, block: Block) -> None:
        if block.ref_count == 0 and block.block_hash is not None:
            del self._evictable[block.block_id]
        block.ref_count += 1

    def _uncache(self, block: Block) -> None:
        value = block.block_hash
        assert value is not None
        del self._cached[value]
        block.block_hash = None
        if not self._record:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, list):
            last.append(value)
            return
        self._events.append([value])

    def _stored(self, value: int, parent: int | None, tokens: Sequence[int], key: CacheKey, request_id: str) -> None:
        """Record a stored block, extending the previous event when it continues that chain."""
        if not self._record:
            return
        last = self._events[-1] if self._events else None
        if (
            parent is not None
            and isinstance(last, _Stored)
            and last.request_id == request_id
            and last.hashes[-1] == parent
        ):
            last.hashes.append(value)
            last.tokens.extend(tokens)
            return
        self._events.append(_Stored(request_id, parent, key, [value], list(tokens)))


__all__ = ["Block", "BlockManager", "BlockTable", "CacheKey", "block_hash"]
