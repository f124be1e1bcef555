"""The remote's KV event messages as the SPI's values, which the gateway turns back into the same messages.

Every field the contract carries is kept (presence included), so what the front gateway forwards is
what the remote sent. An event with no kind set tells a subscriber nothing and is not forwarded.
Repeated fields are handed on as the message's own containers, not copied.
"""

from __future__ import annotations

from collections.abc import Iterable

from openengine_gateway import pb
from openengine_gateway.spi import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    Endpoint,
    KvEvent,
    KvEventBatch,
    KvEventSource,
)

from .responses import kv_session


def kv_batch(batch: pb.KvEventBatch) -> KvEventBatch:
    """A received batch, numbers and rank as the remote sent them."""
    return KvEventBatch(
        events=[event for event in map(kv_event, batch.events) if event is not None],
        data_parallel_rank=batch.data_parallel_rank,
        sequence_number=batch.sequence_number,
        timestamp_unix_nanos=batch.timestamp_unix_nanos,
    )


def kv_event(event: pb.KvEvent) -> KvEvent | None:
    """One received event, or None for one without a kind."""
    session = kv_session(event.kv_session) if event.HasField("kv_session") else None
    kind = event.WhichOneof("event")
    if kind == "block_stored":
        stored = event.block_stored
        return BlockStored(
            block_hashes=_hashes(stored.block_hashes),
            token_ids=stored.token_ids,
            parent_block_hash=_hash(stored.parent_block_hash) if stored.HasField("parent_block_hash") else None,
            block_size=stored.block_size,
            lora_id=stored.lora_id,
            lora_name=stored.lora_name,
            medium=stored.medium,
            extra_keys=[keys.values for keys in stored.extra_keys],
            group_idx=stored.group_idx,
            kv_cache_spec_kind=stored.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=stored.kv_cache_spec_sliding_window,
            request_id=event.request_id,
            kv_session=session,
        )
    if kind == "block_removed":
        removed = event.block_removed
        return BlockRemoved(
            block_hashes=_hashes(removed.block_hashes),
            medium=removed.medium,
            group_idx=removed.group_idx,
            request_id=event.request_id,
            kv_session=session,
        )
    if kind == "all_blocks_cleared":
        return AllBlocksCleared(request_id=event.request_id, kv_session=session)
    return None


def _hash(value: pb.KvBlockHash) -> BlockHash:
    return BlockHash(value.value, value.encoding)


def _hashes(values: Iterable[pb.KvBlockHash]) -> list[BlockHash]:
    return [_hash(value) for value in values]


def kv_source(source: pb.KvEventSource) -> KvEventSource:
    """A publisher the remote listed (``GetKvEventSources``), unset optional fields as None."""
    address = source.endpoint_addr
    return KvEventSource(
        transport=source.transport,
        endpoint=Endpoint(address.host, address.port, address.protocol) if source.HasField("endpoint_addr") else None,
        topic=source.topic,
        replay_endpoint=source.replay_endpoint,
        data_parallel_rank=source.data_parallel_rank if source.HasField("data_parallel_rank") else None,
        encoding=source.encoding,
        schema_version=source.schema_version if source.HasField("schema_version") else None,
        buffer_steps=source.buffer_steps if source.HasField("buffer_steps") else None,
        hwm=source.hwm if source.HasField("hwm") else None,
        max_queue_size=source.max_queue_size if source.HasField("max_queue_size") else None,
    )


__all__ = ["kv_batch", "kv_event", "kv_source"]
