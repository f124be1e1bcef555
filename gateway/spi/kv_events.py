"""KV cache events as a driver reports them: batches of stored, removed and cleared blocks.

A driver that sets ``EngineFacts.publishes_kv_events`` yields ``KvEventBatch`` values from
``Backend.kv_events``; the gateway numbers, retains, snapshots and fans them out, and turns them
into the contract's ``KvEventBatch`` messages itself. The fields mirror those messages, so a
driver's events reach subscribers unchanged. An engine that publishes over ZMQ (vLLM's and SGLang's
``ZmqEventPublisher``) is served by ``spi.zmq_kv``, which yields these values already.

Sequences are kept as given (a driver's own list is not copied here): build a new one per event.
Mediums are ``openengine.v1`` ``StorageMedium`` values (``pb.STORAGE_MEDIUM_GPU``...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import pb
from .requests import Endpoint, KvSession

_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class BlockHash:
    """A block's hash as bytes, with how to read them (``int64``, ``string``, ``bytes``, ``engine_specific``)."""

    value: bytes
    encoding: str = "bytes"

    @classmethod
    def of(cls, value: bytes | int) -> BlockHash:
        """Bytes (a sha256) as they are; an int as a 64-bit value, two's complement, 8 bytes big-endian."""
        if isinstance(value, bytes):
            return cls(value, "bytes")
        return cls((int(value) & _U64).to_bytes(8, "big"), "int64")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine cached, in chain order; ``token_ids`` are theirs, ``block_size`` each.

    ``extra_keys`` holds one tuple of opaque keys per block (a LoRA name, a cache salt, a
    multimodal hash) when the engine publishes them; ``group_idx`` and the ``kv_cache_spec_*``
    fields are vLLM's hybrid-cache metadata.
    """

    block_hashes: Sequence[BlockHash]
    token_ids: Sequence[int] = ()
    parent_block_hash: BlockHash | None = None
    block_size: int = 0
    lora_id: int = 0
    lora_name: str = ""
    medium: pb.StorageMedium.ValueType = pb.STORAGE_MEDIUM_UNSPECIFIED
    extra_keys: Sequence[Sequence[str]] = ()
    group_idx: int = 0
    kv_cache_spec_kind: str = ""
    kv_cache_spec_sliding_window: int = 0
    request_id: str = ""
    kv_session: KvSession | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted from ``medium``."""

    block_hashes: Sequence[BlockHash]
    medium: pb.StorageMedium.ValueType = pb.STORAGE_MEDIUM_UNSPECIFIED
    group_idx: int = 0
    request_id: str = ""
    kv_session: KvSession | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine emptied its cache: every block it announced is gone."""

    request_id: str = ""
    kv_session: KvSession | None = None


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""One KV cache event."""


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """Events of one data-parallel rank, in order.

    A ``sequence_number`` of zero asks the gateway to number the batch; an engine's own
    (non-zero) numbers are kept, and a skip in them is reported to subscribers as lost batches.
    A ``timestamp_unix_nanos`` of zero is stamped with the time the gateway received it.
    """

    events: Sequence[KvEvent] = ()
    data_parallel_rank: int = 0
    sequence_number: int = 0
    timestamp_unix_nanos: int = 0


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """An engine-native KV event publisher a client may subscribe to directly (``GetKvEventSources``).

    ``transport`` is ``zmq`` or ``grpc``, ``encoding`` ``msgpack`` or ``protobuf``. ``endpoint`` is
    where it listens; a wildcard host (``*``, ``0.0.0.0``) is fine, the gateway advertises its own
    routable host instead, and renumbers ``data_parallel_rank`` as it does the engine's batches.
    ``None`` marks what the engine does not say.
    """

    transport: str = ""
    endpoint: Endpoint | None = None
    topic: str = ""
    replay_endpoint: str = ""
    data_parallel_rank: int | None = None
    encoding: str = ""
    schema_version: int | None = None
    buffer_steps: int | None = None
    hwm: int | None = None
    max_queue_size: int | None = None


__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "KvEventBatch",
    "KvEventSource",
]
