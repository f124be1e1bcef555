"""KV cache events and prefix caching on real vLLM (both run on the CPU build)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

pytest.importorskip("vllm")

from openengine_gateway import pb

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect

from .reference import Reference

pytestmark = pytest.mark.vllm


async def test_kv_events_and_sources(stub: pb.OpenEngineStub, reference: Reference) -> None:
    sources = (await stub.GetKvEventSources(pb.GetKvEventSourcesRequest())).sources
    assert len(sources) == 1 and sources[0].transport == "zmq" and sources[0].encoding == "msgpack"
    assert sources[0].endpoint_addr.host not in ("*", "0.0.0.0", "") and sources[0].endpoint_addr.port > 0
    assert sources[0].data_parallel_rank == 0 and sources[0].topic == "kv"
    prompt = reference.encode("kv events " * 30)[:70]
    subscription = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
    stored: list[pb.BlockStored] = []
    numbers: list[int] = []

    async def read() -> None:
        async for response in subscription:
            numbers.append(response.batch.sequence_number)
            stored.extend(e.block_stored for e in response.batch.events if e.HasField("block_stored"))
            if sum(len(s.block_hashes) for s in stored) >= 2:
                return

    reader = asyncio.ensure_future(read())
    for attempt in range(50):  # the gateway's ZMQ subscription joins asynchronously
        await collect(stub, generate_request(f"kv-{attempt}", prompt=prompt, stopping=pb.StoppingOptions(max_tokens=1)))
        done, _ = await asyncio.wait({reader}, timeout=0.2)
        if done:
            break
    await asyncio.wait_for(reader, 5)
    subscription.cancel()
    first = stored[0]
    assert first.block_size == 32 and list(first.token_ids) == prompt[: 32 * len(first.block_hashes)]
    sizes = {"bytes": 32, "int64": 8}  # sha256 bytes, or 64-bit ints (vLLM's default for events)
    assert len(first.block_hashes[0].value) == sizes[first.block_hashes[0].encoding]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


async def test_prefix_cache_hits_bypass_and_salt(stub: pb.OpenEngineStub, reference: Reference) -> None:
    prompt = reference.encode("a long shared prefix " * 12)[:100]

    async def cached(request_id: str, **kv: object) -> int:
        request = generate_request(
            request_id, prompt=prompt, stopping=pb.StoppingOptions(max_tokens=1), kv=pb.KvOptions(**kv)
        )
        responses = await collect(stub, request)
        return responses[-1].usage.cached_prompt_tokens

    await cached("warm")
    assert await cached("hit") == 96
    assert await cached("bypass", bypass_prefix_cache=True) == 0
    assert await cached("salted", cache_salt="other-tenant") == 0


async def test_model_name_is_required_to_match(stub: pb.OpenEngineStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL + "-other"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
