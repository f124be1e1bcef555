"""LoRA adapters, KV cache events and prefix caching on real vLLM (all run on the CPU build)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")

from openengine_gateway import pb

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect, tokens

from .reference import TOLERANCE, Reference, write_lora

pytestmark = pytest.mark.vllm

PROMPT = "the quick brown fox jumps over"


async def test_lora_load_generate_list_unload(
    stub: pb.OpenEngineStub, tiny_model: Path, reference: Reference, tmp_path: Path
) -> None:
    adapter = write_lora(tiny_model, tmp_path / "adapter")
    lora = pb.LoraAdapter(lora_id=3, lora_name="sharp", source_path=str(adapter))
    loaded = await stub.LoadLora(pb.LoadLoraRequest(adapter=lora))
    assert not loaded.already_loaded
    assert (await stub.LoadLora(pb.LoadLoraRequest(adapter=lora))).already_loaded
    assert [a.lora_name for a in (await stub.ListLoras(pb.ListLorasRequest())).adapters] == ["sharp"]
    prompt_ids = reference.encode(PROMPT)
    request = generate_request(
        "lora",
        prompt=prompt_ids,
        lora_name="sharp",
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingOptions(max_tokens=12, ignore_eos=True),
        response=pb.ResponseOptions(return_output_logprobs=True),
    )
    got = tokens(await collect(stub, request))
    merged = Reference(tiny_model, lora=adapter).greedy(prompt_ids, 12)
    assert [t.token_id for t in got] == [step.token_id for step in merged]
    assert [step.token_id for step in merged] != [step.token_id for step in reference.greedy(prompt_ids, 12)]
    for token, step in zip(got, merged, strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE)
    await stub.UnloadLora(pb.UnloadLoraRequest(lora_name="sharp"))
    assert not (await stub.ListLoras(pb.ListLorasRequest())).adapters
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(stub, request)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


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
