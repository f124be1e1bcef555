"""SGLang's KV events through the driver: attention-DP ranks, cache salts, endpoints, the radix tree.

The fake publishes as SGLang 0.5.23 does (``fake_radix_cache.py`` names the upstream file of each
behaviour); its page hashes are pinned here to the values SGLang's own ``KVCacheEventRecorder``
computes for the same pages.
"""

from __future__ import annotations

import asyncio
import json
import socket
import types
from pathlib import Path
from typing import Any

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.testing import RunningGateway

from tests.responses import collect

from ..fake_serving import MODEL, serving
from . import fake_engine
from .conftest import GREEDY, request, sglang
from .fake_radix_cache import RadixCache


def free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive free TCP ports (SGLang's rank ``r`` binds base + ``r``)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base + count <= 65535 and all(_free(base + offset) for offset in range(1, count)):
            return base
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def zmq_config(endpoint: str, **fields: Any) -> str:
    return json.dumps({"publisher": "zmq", "endpoint": endpoint, **fields})


def few_tokens(count: int, **fields: Any) -> dict[str, Any]:
    return {"sampling": GREEDY, "stopping": pb.StoppingOptions(max_tokens=count), **fields}


async def subscribed(
    running: RunningGateway, rank: int = 0
) -> tuple[grpc.aio.UnaryStreamCall, pb.SubscribeKvEventsResponse]:
    """A subscription to ``rank`` and the first batch it heard: SGLang's PUB socket drops what it
    sends before a subscriber joins, so warm-up prompts run (pinned to the rank) until one arrives."""
    call = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(data_parallel_ranks=[rank]))
    first = asyncio.ensure_future(call.read())  # never cancelled: cancelling a read ends the call
    for n in range(100):
        kv = pb.KvOptions(data_parallel_rank=rank)
        await collect(running.stub, request(f"warm-up {n:03d}", **few_tokens(1, kv=kv)))
        done, _ = await asyncio.wait({first}, timeout=0.1)
        if done:
            return call, first.result()
    raise AssertionError("no KV batch arrived")


async def test_attention_dp_ranks_are_advertised_routed_and_published_apart(fake: types.ModuleType) -> None:
    """``--dp-size 2 --enable-dp-attention`` is two attention-DP ranks (``attn_dp_size=2, dp_size=1``):
    two publishers on consecutive ports, two load snapshots, and a request routed to rank 1 runs and
    publishes there."""
    port = free_port(2)
    engine = sglang(
        dp_size=2, enable_dp_attention=True, tp_size=2, page_size=2, kv_events_config=zmq_config(f"tcp://*:{port}")
    )
    async with serving(engine) as running:
        info = await running.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert info.parallelism.data_parallel_size == 2
        sources = (await running.stub.GetKvEventSources(pb.GetKvEventSourcesRequest())).sources
        assert [(s.data_parallel_rank, s.endpoint_addr.port) for s in sources] == [(0, port), (1, port + 1)]
        load = await running.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
        assert [rank.data_parallel_rank for rank in load.ranks] == [0, 1]
        call, response = await subscribed(running, rank=1)
        call.cancel()
    assert response.batch.data_parallel_rank == 1
    sent = fake_engine.ENGINES[0].tokenizer_manager.received[-1]
    assert sent.routed_dp_rank == 1


async def test_a_rank_beyond_sglangs_is_refused_before_acceptance(fake: types.ModuleType) -> None:
    async with serving(sglang(dp_size=2, enable_dp_attention=True, tp_size=2)) as running:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await collect(running.stub, request(kv=pb.KvOptions(data_parallel_rank=2)))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fake_engine.ENGINES[0].tokenizer_manager.received == []


async def test_prompt_and_output_pages_are_stored_as_one_chain(fake: types.ModuleType) -> None:
    """SGLang's radix tree takes the prompt once prefilled and, at the finish, the output tokens
    whose KV it computed (all but the last): one page per block, each chained to the one before."""
    async with serving(sglang(page_size=2, kv_events_config=zmq_config(f"tcp://*:{free_port()}"))) as running:
        call, _ = await subscribed(running)
        await collect(running.stub, request("abcd", **few_tokens(3)))
        prompt = await next_stored(call, "abcd")
        output = await next_stored(call, "o ")
        call.cancel()
    assert list(prompt.token_ids) == [ord(c) for c in "abcd"] and len(prompt.block_hashes) == 2
    assert not prompt.HasField("parent_block_hash") and prompt.block_size == 2
    assert list(output.token_ids) == [ord(c) for c in "o "], "'o w' generated; 'w' has no KV yet"
    assert output.parent_block_hash == prompt.block_hashes[-1]


async def test_under_dcp_the_advertised_block_is_the_events_block(fake: types.ModuleType) -> None:
    """With ``--dcp-size 2`` SGLang's tree, allocator and KV events page at ``page_size * 2``: that is
    the block ModelInfo and GetLoad count in."""
    config = zmq_config(f"tcp://*:{free_port()}")
    async with serving(sglang(page_size=2, dcp_size=2, max_total_tokens=4096, kv_events_config=config)) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        load = await running.stub.GetLoad(pb.GetLoadRequest())
        call, _ = await subscribed(running)
        await collect(running.stub, request("abcdefgh", **few_tokens(1)))
        prompt = await next_stored(call, "abcd")
        call.cancel()
    assert (info.kv_block_size, info.total_kv_blocks, load.total_kv_blocks) == (4, 1024, 1024)
    assert prompt.block_size == 4 and len(prompt.block_hashes) == 2


async def test_salted_and_unsalted_copies_of_a_prefix_publish_apart(fake: types.ModuleType) -> None:
    """SGLang seeds a salted chain's hashes with the salt and carries it as ``cache_salt``: the
    gateway hands it on as every block's extra key."""
    async with serving(sglang(page_size=2, kv_events_config=zmq_config(f"tcp://*:{free_port()}"))) as running:
        call, _ = await subscribed(running)
        await collect(running.stub, request("abcd", **few_tokens(1)))
        plain = await next_stored(call, "abcd")
        salted_response = await collect(running.stub, request("abcd", **few_tokens(1, kv=pb.KvOptions(cache_salt="t"))))
        salted = await next_stored(call, "abcd")
        call.cancel()
    assert not plain.extra_keys
    assert [list(keys.values) for keys in salted.extra_keys] == [["t"], ["t"]]
    assert not set(h.value for h in salted.block_hashes) & set(h.value for h in plain.block_hashes)
    assert salted_response[-1].usage.cached_prompt_tokens == 0, "a salt namespaces the prefix cache"


async def next_stored(call: grpc.aio.UnaryStreamCall, tokens: str) -> pb.BlockStored:
    """The next ``BlockStored`` whose tokens begin with ``tokens`` (warm-up events skipped)."""
    wanted = [ord(c) for c in tokens]
    while True:
        read = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({read}, timeout=5)
        assert done, f"no BlockStored of {tokens!r} arrived"
        response = read.result()
        assert isinstance(response, pb.SubscribeKvEventsResponse) and response.HasField("batch")
        for event in response.batch.events:
            if event.HasField("block_stored") and list(event.block_stored.token_ids[: len(wanted)]) == wanted:
                return event.block_stored


async def test_an_ipc_publisher_is_subscribed_to_but_not_advertised(fake: types.ModuleType, tmp_path: Path) -> None:
    """SGLang binds ``ipc://`` endpoints; the gateway reads them, and has no host:port to advertise."""
    config = zmq_config(f"ipc://{tmp_path / 'kv.sock'}")
    async with serving(sglang(page_size=2, kv_events_config=config)) as running:
        sources = await running.stub.GetKvEventSources(pb.GetKvEventSourcesRequest())
        call, _ = await subscribed(running)
        call.cancel()
    assert list(sources.sources) == []


async def test_an_inproc_publisher_is_refused_before_sglang_starts(fake: types.ModuleType) -> None:
    """SGLang binds ``inproc://`` inside its scheduler process: no gateway socket could connect."""
    with pytest.raises(ConfigurationError, match="only inside SGLang's scheduler process"):
        await sglang(kv_events_config=zmq_config("inproc://cache")).start()
    assert fake_engine.ENGINES == []


def test_the_fakes_hashes_are_sglangs() -> None:
    """Pinned to what SGLang 0.5.23's ``KVCacheEventRecorder.record_store`` publishes for pages of
    4 of tokens 1..12 inserted as 1..8 then 1..12, unsalted and with salt ``"a"``."""
    expected = {
        None: [-3488128144981237669, 5674439469042975057, -1307369107475853156],
        "a": [7720172050927801512, -3736048991043000424, 6215492247015988948],
    }
    for salt, hashes in expected.items():
        cache = RadixCache(page_size=4, capacity=100)
        cache.insert(list(range(1, 9)), salt)
        cache.insert(list(range(1, 13)), salt)
        (event,) = cache.take()
        assert event["block_hashes"] == hashes and event.get("cache_salt") == salt


def test_the_fakes_eviction_removes_least_recently_used_leaves_whole() -> None:
    cache = RadixCache(page_size=2, capacity=8)
    cache.insert([1, 2, 3, 4], None)
    cache.insert([5, 6, 7, 8], None)
    stored_first = cache.take()[0]["block_hashes"]
    cache.insert([9, 10, 11, 12], None)
    removed, new = cache.take()
    assert removed == {"type": "BlockRemoved", "block_hashes": stored_first, "medium": "GPU"}
    assert new["type"] == "BlockStored" and new["parent_block_hash"] is None
