"""KV events made by SGLang's own code, decoded by the driver's decoder (``openengine_gateway.spi.zmq_kv``).

The events come from SGLang's radix caches, built without memory pools: the legacy one
(``mem_cache/radix_cache.py``, ``RadixCache.create_simulated``) and 0.5.23's default,
``UnifiedRadixCache`` on its Rust tree core (``unified_cache``), through their recorders, are
batched as the scheduler batches them (``KVEventBatch``) and go out through SGLang's
``ZmqEventPublisher`` (``disaggregation/kv_events.py``), one per attention-DP rank as its
scheduler creates them, over real sockets on 127.0.0.1 and in a temporary directory.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import socket
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openengine_backends.sglang import capabilities, kv_publishers
from openengine_backends.sglang.server_args import server_kwargs
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto, kv_source_to_proto
from openengine_gateway.spi import KvEventBatch
from openengine_gateway.spi.zmq_kv import decode_batch, subscribe

PAGE = 4


class _Allocator:
    """What eviction hands freed KV slots to; a simulated cache holds no memory."""

    device = "cpu"

    def free_segment(self, *args: Any, **kwargs: Any) -> None:
        pass


def radix_cache(*, dynamo: bool = False) -> Any:
    from sglang.srt.mem_cache.radix_cache import RadixCache

    cache = RadixCache.create_simulated(
        page_size=PAGE, enable_kv_cache_events=True, mock_allocator=_Allocator(), dynamo_kv_event_format=dynamo
    )
    cache.take_events()  # the AllBlocksCleared of its construction
    return cache


def unified_cache() -> Any:
    """0.5.23's default prefix cache, ``UnifiedRadixCache`` (``mem_cache/unified_radix_cache.py``), on its
    default Rust tree core, with full-attention KV only (what a plain decoder model runs) and no memory pools."""
    import torch
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=_Allocator(),
        page_size=PAGE,
        enable_kv_cache_events=True,
        tree_components=(ComponentType.FULL,),
    )
    cache = UnifiedRadixCache(params)
    cache.kv_values = torch.arange  # what the KV slots of n tokens are, for insert
    cache.take_events()  # the AllBlocksCleared of its construction
    return cache


def insert(cache: Any, tokens: Sequence[int], *, salt: str | None = None) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    key = RadixKey(array("q", tokens), cache_salt=salt)
    values = getattr(cache, "kv_values", None)
    cache.insert(InsertParams(key=key) if values is None else InsertParams(key=key, value=values(len(key))))


def evict_all(cache: Any) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache.evict(EvictParams(num_tokens=1 << 20))


def batch(events: list[Any], ts: float = 1_700_000_000.5) -> Any:
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    return KVEventBatch(ts=ts, events=events)


def encoded(events: list[Any]) -> bytes:
    """A batch's payload as the publisher thread encodes it (``msgspec.msgpack.Encoder``)."""
    return msgspec.msgpack.Encoder().encode(batch(events))


def decode(payload: bytes, sequence: int) -> pb.KvEventBatch:
    """The driver's decoded batch as the gateway sends it."""
    return kv_batch_to_proto(decode_batch(payload, sequence))


def int64(value: int) -> pb.KvBlockHash:
    return pb.KvBlockHash(value=value.to_bytes(8, "big", signed=True), encoding="int64")


def assert_stored(decoded: pb.KvEvent, event: Any) -> None:
    """The driver's ``BlockStored`` says what SGLang's says."""
    stored = decoded.block_stored
    assert list(stored.block_hashes) == [int64(h) for h in event.block_hashes]
    if event.parent_block_hash is None:
        assert not stored.HasField("parent_block_hash")
    else:
        assert stored.parent_block_hash == int64(event.parent_block_hash)
    assert list(stored.token_ids) == list(event.token_ids)
    assert stored.block_size == event.block_size == PAGE
    assert stored.medium == pb.STORAGE_MEDIUM_GPU


def test_a_prefix_and_its_extension_chain_their_pages() -> None:
    cache = radix_cache()
    insert(cache, range(10))  # two full pages; the partial third is not cached
    (first,) = cache.take_events()
    insert(cache, range(16))
    (second,) = cache.take_events()
    decoded = decode(encoded([first, second]), 0)
    assert decoded.sequence_number == 1, "the engine's first batch is number 0"
    assert decoded.timestamp_unix_nanos == 1_700_000_000_500_000_000
    assert [len(e.block_stored.block_hashes) for e in decoded.events] == [2, 2]
    assert_stored(decoded.events[0], first)
    assert_stored(decoded.events[1], second)
    assert decoded.events[1].block_stored.parent_block_hash == decoded.events[0].block_stored.block_hashes[-1]


def test_pages_stored_in_one_step_come_as_one_chained_event() -> None:
    """The recorder coalesces a store whose parent is the previous store's last page (``enqueue``)."""
    cache = radix_cache()
    insert(cache, range(8))
    insert(cache, range(16))
    (stored,) = cache.take_events()
    decoded = decode(encoded([stored]), 0)
    assert len(decoded.events[0].block_stored.block_hashes) == 4
    assert_stored(decoded.events[0], stored)


def test_eviction_removes_the_stored_hashes_and_a_reset_clears_all() -> None:
    cache = radix_cache()
    insert(cache, range(8))
    (stored,) = cache.take_events()
    evict_all(cache)
    cache.reset()
    removed, cleared = cache.take_events()
    decoded = decode(encoded([stored, removed, cleared]), 41)
    assert decoded.sequence_number == 42
    kinds = [event.WhichOneof("event") for event in decoded.events]
    assert kinds == ["block_stored", "block_removed", "all_blocks_cleared"]
    assert list(decoded.events[1].block_removed.block_hashes) == list(decoded.events[0].block_stored.block_hashes)
    assert decoded.events[1].block_removed.medium == pb.STORAGE_MEDIUM_GPU


def test_host_tier_events_carry_their_medium() -> None:
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, StorageMedium

    stored = BlockStored(
        block_hashes=[7], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4, lora_id=None,
        medium=StorageMedium.CPU,
    )  # fmt: skip
    removed = BlockRemoved(block_hashes=[7], medium=StorageMedium.EXTERNAL)
    decoded = decode(encoded([stored, removed]), 0)
    assert decoded.events[0].block_stored.medium == pb.STORAGE_MEDIUM_CPU_PINNED
    assert decoded.events[1].block_removed.medium == pb.STORAGE_MEDIUM_EXTERNAL


def test_eagle_bigram_pages_decode_to_their_tokens() -> None:
    """EAGLE keys the radix tree by bigrams and publishes each position as (token, next token)."""
    cache = radix_cache()
    cache.is_eagle = True
    insert(cache, range(20, 29))  # eight bigrams: two pages
    (stored,) = cache.take_events()
    assert stored.token_ids[0] == (20, 21)
    decoded = decode(encoded([stored]), 0)
    assert list(decoded.events[0].block_stored.token_ids) == list(range(20, 28))


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_salted_prefix_publishes_other_hashes_than_the_same_tokens_unsalted(dynamo: bool) -> None:
    """In 0.5.23's default format a salted node's event hashes are seeded by its salt
    (``mem_cache/utils.py compute_node_event_hash_values``), and the dynamo format namespaces them
    by it too (``kv_event_namespace_seed``): a salted and an unsalted copy of one prefix, or two
    salts, never collide in a subscriber's index."""
    cache = radix_cache(dynamo=dynamo)
    insert(cache, range(8))
    insert(cache, range(8), salt="tenant-a")
    insert(cache, range(8), salt="tenant-b")
    plain, salted_a, salted_b = (decode(encoded([e]), 0).events[0] for e in cache.take_events())
    hashes = [tuple(h.value for h in e.block_stored.block_hashes) for e in (plain, salted_a, salted_b)]
    assert len(set(hashes)) == 3


def _free_port_pair() -> int:
    """A base port whose next port is free too (rank 1 publishes on base + 1)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
        return base
    raise RuntimeError("no free port pair")


async def _receive(
    stream: AsyncIterator[KvEventBatch], publishers: dict[int, Any], wanted: dict[int, list[list[Any]]]
) -> dict[int, list[pb.KvEventBatch]]:
    """Probe every publisher until its subscription is live (ZMQ drops what a PUB sends before),
    then publish ``wanted`` per rank and return what arrived with events in it."""
    live: set[int] = set()
    pending: asyncio.Future[KvEventBatch] | None = None
    deadline = time.monotonic() + 20
    while live != set(publishers):
        assert time.monotonic() < deadline, f"ranks {set(publishers) - live} never reached the subscriber"
        for rank in set(publishers) - live:
            publishers[rank].publish(batch([], ts=time.time()))
        pending = pending or asyncio.ensure_future(stream.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.05)
        while done:
            live.add(pending.result().data_parallel_rank)
            pending = asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=0.01)
    for rank, batches in wanted.items():
        for events in batches:
            publishers[rank].publish(batch(events, ts=time.time()))
    received: dict[int, list[pb.KvEventBatch]] = {rank: [] for rank in wanted}
    while sum(map(len, received.values())) < sum(map(len, wanted.values())):
        assert pending is not None
        decoded = await asyncio.wait_for(pending, timeout=20)
        if decoded.events:
            received[decoded.data_parallel_rank].append(kv_batch_to_proto(decoded))
        pending = asyncio.ensure_future(stream.__anext__())
    if pending is not None:
        pending.cancel()
    return received


def _publishers(server: dict[str, Any]) -> dict[int, Any]:
    """One ``ZmqEventPublisher`` per scheduler that owns one, as SGLang's schedulers create them."""
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory, select_kv_publisher_dp_rank

    attn_dp_size = int(server.get("attn_dp_size") or 1)
    publishers = {}
    for dp_rank in range(int(server.get("dp_size") or 1)):
        for attn_dp_rank in range(attn_dp_size):
            rank = select_kv_publisher_dp_rank(attn_dp_size, attn_dp_rank, dp_rank)
            publishers[rank] = EventPublisherFactory.create(server["kv_events_config"], attn_dp_rank=rank)
    return publishers


async def _round_trip(server: dict[str, Any]) -> None:
    """Each rank's radix-cache events, published by SGLang and read by the driver's subscriber."""
    publishers = _publishers(server)
    sources = kv_publishers.kv_event_publishers(server)
    assert set(sources) == set(publishers), "the driver subscribes to every rank SGLang publishes on"
    wanted: dict[int, list[list[Any]]] = {}
    for rank in publishers:
        cache = radix_cache()
        insert(cache, range(rank * 100, rank * 100 + 8))
        first = cache.take_events()
        evict_all(cache)
        wanted[rank] = [first, cache.take_events()]
    stream = subscribe(sources)
    try:
        received = await _receive(stream, publishers, wanted)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        for publisher in publishers.values():
            publisher.shutdown()
            atexit.unregister(publisher.shutdown)  # its second shutdown would wait a second for nothing
    for rank, (stored_batch, removed_batch) in received.items():
        assert stored_batch.data_parallel_rank == removed_batch.data_parallel_rank == rank
        assert removed_batch.sequence_number == stored_batch.sequence_number + 1
        (stored,) = wanted[rank][0]
        assert_stored(stored_batch.events[0], stored)
        assert list(stored_batch.events[0].block_stored.token_ids) == list(range(rank * 100, rank * 100 + 8))
        assert list(removed_batch.events[0].block_removed.block_hashes) == [int64(h) for h in stored.block_hashes]


def _server(model: Path, **options: Any) -> dict[str, Any]:
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**server_kwargs(str(model), {"device": "cpu", **options}))
    args.resolve_once()
    return dict(args.resolved_dict())


async def test_every_attention_dp_rank_publishes_and_is_read(tiny_model: Path) -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{_free_port_pair()}", "topic": "kv"})
    server = _server(tiny_model, dp_size="2", enable_dp_attention="true", tp_size="2", kv_events_config=config)
    await _round_trip(server)


async def test_data_parallel_replicas_publish_and_are_read(tiny_model: Path) -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://0.0.0.0:{_free_port_pair()}"})
    await _round_trip(_server(tiny_model, dp_size="2", kv_events_config=config))


async def test_an_ipc_publisher_is_read(tiny_model: Path, tmp_path: Path) -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": f"ipc://{tmp_path}/kv-events", "topic": "kv"})
    await _round_trip(_server(tiny_model, kv_events_config=config))


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5557", "tcp://collector.example:5557"])
def test_a_publisher_that_connects_out_is_not_subscribed_to(tiny_model: Path, endpoint: str) -> None:
    """SGLang connects (rather than binds) a concrete-host endpoint: there is nothing to subscribe to."""
    config = json.dumps({"publisher": "zmq", "endpoint": endpoint})
    assert kv_publishers.kv_event_publishers(_server(tiny_model, kv_events_config=config)) == {}


@pytest.mark.parametrize(
    "endpoint", ["tcp://*:5557", "tcp://127.0.0.1:5557", "tcp://[::1]:5557", "inproc://kv", "tcp://0.0.0.0:6000"]
)
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_each_ranks_endpoint_is_the_one_sglang_derives(endpoint: str, rank: int) -> None:
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    assert kv_publishers.rank_endpoint(endpoint, rank) == ZmqEventPublisher.offset_endpoint_port(endpoint, rank)


@pytest.mark.parametrize(
    ("endpoint", "bind"),
    [("tcp://*:{port}", None), ("tcp://0.0.0.0:{port}", None), ("tcp://127.0.0.1:{port}", None),
     ("tcp://127.0.0.1:{port}", True), ("ipc://{dir}/kv", None)],
)  # fmt: skip
def test_the_driver_subscribes_exactly_where_sglangs_publisher_binds(
    tmp_path: Path, endpoint: str, bind: bool | None
) -> None:
    """``ZmqEventPublisher._socket_setup`` binds or connects; only a bound socket can be subscribed to."""
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory

    config: dict[str, Any] = {"publisher": "zmq", "endpoint": endpoint.format(port=_free_port_pair(), dir=tmp_path)}
    if bind is not None:
        config["bind"] = bind
    publisher = EventPublisherFactory.create(json.dumps(config))
    try:
        binds = publisher._local_pub_endpoint is not None
    finally:
        publisher.shutdown()
        atexit.unregister(publisher.shutdown)
    assert kv_publishers.publisher_binds(config, config["endpoint"]) == binds
    assert bool(kv_publishers.kv_event_publishers({"kv_events_config": json.dumps(config)})) == binds


@pytest.mark.parametrize(
    "options",
    [
        {"page_size": "16"},
        {"dp_size": "2", "enable_dp_attention": "true", "tp_size": "2"},
        {"dp_size": "2"},
        {"dcp_size": 2, "page_size": 16, "tp_size": 2},
    ],
)
def test_the_sources_the_driver_advertises_are_the_ones_sglang_describes(
    tiny_model: Path, options: dict[str, Any]
) -> None:
    """SGLang's own ``/server_info`` KV-event descriptor (``runtime_context.describe_kv_events_publisher``):
    port base, topic, replay port base, block size and one rank per DP rank."""
    from sglang.srt.runtime_context import describe_kv_events_publisher
    from sglang.srt.server_args import ServerArgs

    config = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}
    args = ServerArgs(
        **server_kwargs(str(tiny_model), {"device": "cpu", "kv_events_config": json.dumps(config), **options})
    )
    args.resolve_once()
    server = dict(args.resolved_dict())
    described = describe_kv_events_publisher(args)
    assert described is not None
    sources = [kv_source_to_proto(source) for source in kv_publishers.kv_event_sources(server)]
    assert len(sources) == described["dp_size"]
    for rank, source in enumerate(sources):
        assert source.data_parallel_rank == rank
        assert source.endpoint_addr.port == described["endpoint_port_base"] + rank
        assert source.topic == described["topic"]
        assert source.replay_endpoint == f"tcp://*:{described['replay_endpoint_port_base'] + rank}"
    state = capabilities.EngineState(server=server, context_len=256, max_req_input_len=250, vocab_size=512)
    assert capabilities.model_info(state).kv_block_size == described["block_size"]


def test_a_salted_blocks_salt_reaches_subscribers_as_its_extra_key() -> None:
    """SGLang's ``BlockStored.cache_salt`` (set from the radix key's salt), one extra key per block."""
    cache = radix_cache()
    insert(cache, range(8), salt="tenant-a")
    insert(cache, range(100, 108))
    salted, plain = (decode(encoded([e]), 0).events[0].block_stored for e in cache.take_events())
    assert (
        [list(keys.values) for keys in salted.extra_keys]
        == [["tenant-a"]] * len(salted.block_hashes)
        == [["tenant-a"]] * 2
    )
    assert not plain.extra_keys


def test_the_default_caches_stores_extensions_salts_and_evictions_decode_as_it_publishes_them() -> None:
    """What 0.5.23's default cache publishes, step by step as the scheduler takes its events."""
    cache = unified_cache()
    assert cache._tree_core_backend == "rust", "0.5.23's default tree core"
    steps = []
    for tokens, salt in ((range(10), None), (range(16), None), (range(8), "tenant-a")):
        insert(cache, tokens, salt=salt)  # ten tokens: two full pages, the partial third is not cached
        steps.append(cache.take_events())
    evict_all(cache)
    steps.append(cache.take_events())
    assert [len(events) for events in steps] == [1, 1, 1, 1]
    sent = [event for events in steps for event in events]
    decoded = decode(encoded(sent), 6)
    assert decoded.sequence_number == 7
    kinds = [event.WhichOneof("event") for event in decoded.events]
    assert kinds == ["block_stored"] * 3 + ["block_removed"]
    for event, original in zip(decoded.events[:3], sent, strict=False):
        assert_stored(event, original)
    first, second, salted = (event.block_stored for event in decoded.events[:3])
    assert second.parent_block_hash == first.block_hashes[-1], "the extension chains to the prefix's last page"
    assert list(second.token_ids) == list(range(8, 16))
    assert [list(keys.values) for keys in salted.extra_keys] == [["tenant-a"]] * 2
    assert not {h.value for h in salted.block_hashes} & {h.value for h in first.block_hashes}
    stored = {h.value for e in (first, second, salted) for h in e.block_hashes}
    assert {h.value for h in decoded.events[3].block_removed.block_hashes} == stored, "every stored page evicted"
