"""TensorRT-LLM's KV cache events → ``KvEventBatch`` values: pure, stateful only for partial blocks.

``LLM.get_kv_cache_events_async`` yields Python dicts (TensorRT-LLM's ``KVCacheEventSerializer``):
``{"event_id", "data": {"type": ...}, "window_size"[, "attention_dp_rank"]}`` where ``data`` is

* ``stored``: ``parent_hash`` and ``blocks``, each ``{"block_hash", "tokens": [{"token_id",
  "token_extra_id"}], "cache_level", "priority"[, "lora_id"]}``;
* ``removed``: ``block_hashes``;
* ``created`` and ``updated`` (pool sizes, priority and level changes): nothing to route on.

TensorRT-LLM also stores partially filled blocks (for partial reuse); a router keys blocks by
full token blocks, so a partial block, and anything chained after it, is not announced, and
its later removal is dropped too. Hashes are 64-bit values: sent as int64 (``BlockHash.of``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from openengine_gateway import pb
from openengine_gateway.spi import BlockHash, BlockRemoved, BlockStored, KvEvent, KvEventBatch

_MEDIUMS = {0: pb.STORAGE_MEDIUM_GPU, 1: pb.STORAGE_MEDIUM_CPU_PINNED}
_U64 = (1 << 64) - 1


class KvEventMapper:
    """Maps one engine's event dicts to batches, remembering the partial blocks it withheld.

    ``tokens_per_block`` is the engine's block size; None (unknown) announces every block.
    """

    __slots__ = ("_partial", "_tokens_per_block")

    def __init__(self, tokens_per_block: int | None) -> None:
        self._tokens_per_block = tokens_per_block
        self._partial: set[int] = set()

    def batch(self, event: Mapping[str, Any], *, timestamp_ns: int) -> KvEventBatch | None:
        """The batch for one event, or None when it has nothing to announce."""
        data = event.get("data") or {}
        kind = data.get("type")
        if kind == "stored":
            mapped = self._stored(data.get("parent_hash"), data.get("blocks") or ())
        elif kind == "removed":
            mapped = self._removed(data.get("block_hashes") or ())
        else:
            mapped = None
        if mapped is None:
            return None
        return KvEventBatch(
            events=[mapped],
            data_parallel_rank=int(event.get("attention_dp_rank") or 0),
            timestamp_unix_nanos=timestamp_ns,
        )

    def _stored(self, parent: int | None, blocks: Sequence[Mapping[str, Any]]) -> KvEvent | None:
        full: list[Mapping[str, Any]] = []
        for position, block in enumerate(blocks):
            if self._tokens_per_block and len(block.get("tokens") or ()) != self._tokens_per_block:
                self._partial.update(int(b["block_hash"]) & _U64 for b in blocks[position:])
                break
            full.append(block)
        if not full:
            return None
        first = full[0]
        return BlockStored(
            block_hashes=[BlockHash.of(int(block["block_hash"])) for block in full],
            token_ids=[int(token["token_id"]) for block in full for token in block.get("tokens") or ()],
            parent_block_hash=None if parent is None else BlockHash.of(int(parent)),
            block_size=self._tokens_per_block or len(first.get("tokens") or ()),
            lora_id=int(first.get("lora_id") or 0),
            medium=_MEDIUMS.get(int(first.get("cache_level") or 0), pb.STORAGE_MEDIUM_UNSPECIFIED),
        )

    def _removed(self, hashes: Sequence[int]) -> KvEvent | None:
        announced = []
        for value in hashes:
            key = int(value) & _U64
            if key in self._partial:
                self._partial.discard(key)
            else:
                announced.append(BlockHash.of(int(value)))
        if not announced:
            return None
        return BlockRemoved(block_hashes=announced)


__all__ = ["KvEventMapper"]
