"""KV events and ranks on real SGLang: salted prefixes publish apart, attention-DP ranks publish apart (GPU only)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

pytest.importorskip("sglang")

from openengine_gateway import pb

from tests.engines.streams import free_port, generate_request
from tests.responses import collect

from .conftest import engine_of, start

pytestmark = pytest.mark.sglang

PROMPT = "the quick brown fox jumps over the lazy dog " * 4


async def stored(call: grpc.aio.UnaryStreamCall, ids: list[int]) -> pb.BlockStored:  # type: ignore[type-arg]
    """The next ``BlockStored`` that starts with ``ids`` (SGLang's warm-up requests publish too)."""
    while True:
        response = await asyncio.wait_for(call.read(), 30)
        for event in response.batch.events:
            if event.HasField("block_stored") and list(event.block_stored.token_ids[: len(ids)]) == ids:
                return event.block_stored


async def test_a_salted_copy_of_a_prefix_publishes_other_blocks_carrying_its_salt(tiny_model: Path) -> None:
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv"}
    async with start(tiny_model, kv_events_config=json.dumps(config), page_size=4) as running:
        call = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        ids = list(engine_of(running).tokenizer_manager.tokenizer(PROMPT)["input_ids"])[:4]
        stopping = pb.StoppingOptions(max_tokens=1)
        await collect(running.stub, generate_request("plain", prompt=PROMPT, stopping=stopping))
        salted_request = generate_request("salted", prompt=PROMPT, stopping=stopping, kv=pb.KvOptions(cache_salt="t"))
        await collect(running.stub, salted_request)
        plain, salted = await stored(call, ids), await stored(call, ids)
        call.cancel()
    assert not plain.extra_keys and all(list(keys.values) == ["t"] for keys in salted.extra_keys)
    assert not {h.value for h in salted.block_hashes} & {h.value for h in plain.block_hashes}


async def test_attention_dp_ranks_are_advertised_loaded_and_publish_apart(tiny_model: Path) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("attention data parallelism needs two GPUs (tp_size 2)")
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv"}
    options = {"dp_size": 2, "tp_size": 2, "enable_dp_attention": True, "kv_events_config": json.dumps(config)}
    async with start(tiny_model, **options) as running:
        info = await running.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        sources = await running.stub.GetKvEventSources(pb.GetKvEventSourcesRequest())
        call = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        for rank in (0, 1):
            kv = pb.KvOptions(data_parallel_rank=rank)
            request = generate_request(f"r{rank}", prompt=PROMPT, stopping=pb.StoppingOptions(max_tokens=1), kv=kv)
            await collect(running.stub, request)
        ranks: set[int] = set()
        while ranks != {0, 1}:
            response = await asyncio.wait_for(call.read(), 30)
            if any(event.HasField("block_stored") for event in response.batch.events):
                ranks.add(response.batch.data_parallel_rank)
        call.cancel()
        load = await running.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
    assert info.parallelism.data_parallel_size == 2
    assert sorted(s.data_parallel_rank for s in sources.sources) == [0, 1]
    assert len(load.ranks) == 2
