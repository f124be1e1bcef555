"""Engine-native ZMQ KV-event streams → ``KvEventBatch`` values: a SUB socket and a msgpack decoder.

vLLM's and SGLang's ``ZmqEventPublisher`` (one per data-parallel rank) publish the same wire
format, so every driver of such an engine decodes with this module: three frames per batch, the topic, an 8-byte
big-endian sequence number (from 0) and a msgpack batch encoded array-like as ``[ts, events,
rank]`` (vLLM's ``data_parallel_rank``, SGLang's ``attn_dp_rank``). Events are tagged structs,
encoded two ways: as maps carrying the tag under ``"type"`` (current vLLM and SGLang releases)
and as arrays whose first element is the tag followed by the fields in vLLM's declaration
order (earlier vLLM releases). Both are decoded; fields a release adds that OpenEngine has no
place for (SGLang's ``session_id``; vLLM 0.32's ``locality``, ``ownership`` and ``session_id``,
so a block in a remote tier reads like a local one) are ignored.

A cache salt reaches subscribers in ``extra_keys``, where vLLM publishes it (the bare salt among
the first block's keys, ``to_event_extra_keys``). SGLang publishes it as the event's
``cache_salt`` instead, and a salt namespaces every block of an SGLang event (its radix tree keeps
salted chains apart, and their hashes are seeded with the salt: ``mem_cache/utils.py``
``compute_node_event_hash_values``), so each of the event's blocks gets the salt as its one
extra key.

Mediums are matched whatever their case (a Mooncake store publishes ``"cpu"``). Block hashes are
bytes (sha256) or 64-bit ints (SGLang always, vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).

The engine's sequence numbers are kept, plus one: the gateway reads a zero as "number this
batch for me", and an engine's first batch is number zero.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from ... import pb
from ..kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent, KvEventBatch

_MEDIUMS = {  # vLLM's names, then SGLang's ``StorageMedium`` values
    "GPU": pb.STORAGE_MEDIUM_GPU,
    "CPU": pb.STORAGE_MEDIUM_CPU_PINNED,
    "DISK": pb.STORAGE_MEDIUM_DISK,
    "STORAGE": pb.STORAGE_MEDIUM_EXTERNAL,
    "CPU_PINNED": pb.STORAGE_MEDIUM_CPU_PINNED,
    "EXTERNAL": pb.STORAGE_MEDIUM_EXTERNAL,
}
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_FIELDS = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS, "AllBlocksCleared": ()}


def _fields(event: Any) -> tuple[str, dict[str, Any]]:
    """An event's tag and fields, from either encoding."""
    if isinstance(event, Mapping):
        fields = dict(event)
        return str(fields.pop("type", "")), fields
    if isinstance(event, list | tuple) and event:
        tag = str(event[0])
        return tag, dict(zip(_FIELDS.get(tag, ()), event[1:], strict=False))
    raise ValueError(f"unrecognized KV event encoding: {event!r}")


def _token_ids(values: Sequence[Any]) -> Sequence[Any]:
    """A block's token ids. SGLang's EAGLE engines key their radix cache by bigrams and publish
    each position as the pair (its token, the next token)."""
    if values and isinstance(values[0], list | tuple):
        return [pair[0] for pair in values]
    return values


def _extra_keys(fields: Mapping[str, Any]) -> Sequence[Any]:
    """A stored event's keys per block: vLLM's ``extra_keys``, else SGLang's ``cache_salt`` as
    every block's one key (none without a salt)."""
    keys: Sequence[Any] = fields.get("extra_keys") or ()
    if keys:
        return keys
    salt = fields.get("cache_salt")
    return [[salt]] * len(fields["block_hashes"]) if salt else []


def _key_text(key: Any) -> str:
    """One of a block's extra keys as text: a string as it is, bytes (vLLM's prompt-embeds
    digests) as hex, anything composite (a multimodal ``(identifier, offset)``) as compact JSON."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.hex()
    return json.dumps(key, separators=(",", ":"), default=lambda value: value.hex())


def decode_event(event: Any) -> KvEvent:
    """One ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` as the SPI's event."""
    tag, fields = _fields(event)
    medium = _MEDIUMS.get(str(fields.get("medium") or "").upper(), pb.STORAGE_MEDIUM_UNSPECIFIED)
    if tag == "BlockStored":
        parent = fields.get("parent_block_hash")
        return BlockStored(
            block_hashes=[BlockHash.of(h) for h in fields["block_hashes"]],
            token_ids=_token_ids(fields.get("token_ids") or ()),
            parent_block_hash=None if parent is None else BlockHash.of(parent),
            block_size=fields.get("block_size") or 0,
            lora_id=fields.get("lora_id") or 0,
            lora_name=fields.get("lora_name") or "",
            medium=medium,
            extra_keys=[[_key_text(key) for key in keys or ()] for keys in _extra_keys(fields)],
            group_idx=fields.get("group_idx") or 0,
            kv_cache_spec_kind=fields.get("kv_cache_spec_kind") or "",
            kv_cache_spec_sliding_window=fields.get("kv_cache_spec_sliding_window") or 0,
        )
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=[BlockHash.of(h) for h in fields["block_hashes"]],
            medium=medium,
            group_idx=fields.get("group_idx") or 0,
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event type {tag!r}")


def decode_batch(payload: bytes, sequence: int, *, default_rank: int = 0) -> KvEventBatch:
    """One published batch (``[ts, events, rank]``, or a map of those names)."""
    raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if isinstance(raw, Mapping):
        ts, events, rank = raw.get("ts", 0.0), raw.get("events", ()), raw.get("data_parallel_rank")
    else:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    return KvEventBatch(
        events=[decode_event(event) for event in events],
        data_parallel_rank=default_rank if rank is None else int(rank),
        sequence_number=sequence + 1,
        timestamp_unix_nanos=int(float(ts) * 1e9),
    )


_LOOPBACK = {"tcp://*:": "tcp://127.0.0.1:", "tcp://0.0.0.0:": "tcp://127.0.0.1:", "tcp://[::]:": "tcp://[::1]:"}


def connect_address(endpoint: str) -> str:
    """Where a local subscriber connects for a publisher endpoint (a wildcard means loopback)."""
    for wildcard, loopback in _LOOPBACK.items():
        if endpoint.startswith(wildcard):
            return loopback + endpoint[len(wildcard) :]
    return endpoint


async def subscribe(sources: Mapping[int, tuple[str, str]]) -> AsyncIterator[KvEventBatch]:
    """Decoded batches from every rank's publisher (``rank -> (endpoint, topic)``), as they come."""
    context = zmq.asyncio.Context.instance()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.IPV6, 1)  # IPv4 endpoints still connect; IPv6 ones need it
    try:
        for endpoint, topic in sources.values():
            socket.connect(connect_address(endpoint))
            socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        default_rank = min(sources, default=0)
        while True:
            frames: Sequence[bytes] = await socket.recv_multipart()
            if len(frames) != 3:
                continue
            _, sequence, payload = frames
            yield decode_batch(payload, int.from_bytes(sequence, "big"), default_rank=default_rank)
    finally:
        socket.close(linger=0)


__all__ = ["connect_address", "decode_batch", "decode_event", "subscribe"]
