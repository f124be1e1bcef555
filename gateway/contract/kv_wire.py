"""The SPI's KV event values and publishers as ``openengine.v1`` messages: the one place they are encoded.

Drivers yield ``spi.KvEventBatch`` values and list ``spi.KvEventSource`` publishers; the core
encodes each once, on the way into the KV event hub or a ``GetKvEventSources`` answer. Only what
a value carries is set, so an absent optional number stays absent on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import pb
from ..spi.kv_events import AllBlocksCleared, BlockHash, BlockStored, KvEvent, KvEventBatch, KvEventSource
from .generation import kv_session_to_proto


def kv_batch_to_proto(batch: KvEventBatch, rank: int | None = None) -> pb.KvEventBatch:
    """``batch`` as a message, under ``rank`` when given (the endpoint's rank for the engine's)."""
    return pb.KvEventBatch(
        sequence_number=batch.sequence_number,
        timestamp_unix_nanos=batch.timestamp_unix_nanos,
        data_parallel_rank=batch.data_parallel_rank if rank is None else rank,
        events=[kv_event_to_proto(event) for event in batch.events],
    )


def kv_event_to_proto(event: KvEvent) -> pb.KvEvent:
    """One event as a ``KvEvent`` message."""
    message = pb.KvEvent(request_id=event.request_id)
    if event.kv_session is not None:
        message.kv_session.CopyFrom(kv_session_to_proto(event.kv_session))
    if isinstance(event, BlockStored):
        stored = message.block_stored
        stored.block_hashes.extend(_hashes(event.block_hashes))
        stored.token_ids.extend(event.token_ids)
        stored.block_size = event.block_size
        stored.lora_id = event.lora_id
        stored.lora_name = event.lora_name
        stored.medium = event.medium
        stored.group_idx = event.group_idx
        stored.kv_cache_spec_kind = event.kv_cache_spec_kind
        stored.kv_cache_spec_sliding_window = event.kv_cache_spec_sliding_window
        if event.parent_block_hash is not None:
            stored.parent_block_hash.value = event.parent_block_hash.value
            stored.parent_block_hash.encoding = event.parent_block_hash.encoding
        for keys in event.extra_keys:
            stored.extra_keys.add().values.extend(keys)
    elif isinstance(event, AllBlocksCleared):
        message.all_blocks_cleared.SetInParent()
    else:
        removed = message.block_removed
        removed.block_hashes.extend(_hashes(event.block_hashes))
        removed.medium = event.medium
        removed.group_idx = event.group_idx
    return message


def _hashes(hashes: Sequence[BlockHash]) -> list[pb.KvBlockHash]:
    return [pb.KvBlockHash(value=h.value, encoding=h.encoding) for h in hashes]


def kv_source_to_proto(source: KvEventSource) -> pb.KvEventSource:
    """A publisher as a ``KvEventSource`` message (hosts and ranks still the engine's)."""
    message = pb.KvEventSource(
        transport=source.transport,
        topic=source.topic,
        replay_endpoint=source.replay_endpoint,
        encoding=source.encoding,
    )
    endpoint = source.endpoint
    if endpoint is not None:
        message.endpoint_addr.CopyFrom(
            pb.KvEndpoint(host=endpoint.host, port=endpoint.port, protocol=endpoint.protocol)
        )
    for name in ("data_parallel_rank", "schema_version", "buffer_steps", "hwm", "max_queue_size"):
        value = getattr(source, name)
        if value is not None:
            setattr(message, name, value)
    return message


__all__ = ["kv_batch_to_proto", "kv_event_to_proto", "kv_source_to_proto"]
