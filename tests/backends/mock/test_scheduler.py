"""Continuous batching: prefix cache, KV events, abort, load, priority, preemption, chunking, timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest
from openengine_backends.mock.events import EventOverflow
from openengine_backends.mock.kv_cache import CacheKey, block_hash
from openengine_backends.mock.tokenizer import encode
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_batch_to_proto
from openengine_gateway.spi import BlockHash, LoraAdapter, Sampling, Stopping, UsageReport

from .support import engine, generate, request

T = TypeVar("T")
GREEDY = Sampling(temperature=0.0)
PROMPT = "A prompt long enough to fill a few KV blocks."  # 45 bytes + BOS = 46 tokens


async def drain(source: AsyncIterator[T]) -> list[T]:
    """What an event outbox holds now."""
    items = []
    while True:
        try:
            items.append(await asyncio.wait_for(anext(source), 0.05))
        except TimeoutError:
            return items


async def test_prefix_cache_hits_are_reported_as_cached_prompt_tokens() -> None:
    async with engine() as backend:
        cold = await generate(backend, prompt=PROMPT, sampling=GREEDY)
        warm = await generate(backend, prompt=PROMPT, sampling=GREEDY)
        longer = await generate(backend, prompt=PROMPT + " And more.", sampling=GREEDY)
    assert cold.usage is not None and cold.usage.cached_prompt_tokens == 0
    assert (
        warm.usage is not None and warm.usage.cached_prompt_tokens == 32
    )  # two full blocks; the last token is computed
    assert longer.usage is not None and longer.usage.cached_prompt_tokens == 32
    assert cold.tokens == warm.tokens


async def test_bypass_salt_and_lora_separate_the_cache(tmp_path: object) -> None:
    async with engine() as backend:
        await generate(backend, prompt=PROMPT)
        bypass = await generate(backend, prompt=PROMPT, bypass_prefix_cache=True)
        salted = await generate(backend, prompt=PROMPT, cache_salt="tenant-a")
        salted_again = await generate(backend, prompt=PROMPT, cache_salt="tenant-a")
        other_salt = await generate(backend, prompt=PROMPT, cache_salt="tenant-b")
        await backend.load_lora(LoraAdapter(1, "adapter", str(tmp_path)))
        adapted = await generate(backend, prompt=PROMPT, lora_name="adapter")
        adapted_again = await generate(backend, prompt=PROMPT, lora_name="adapter")
    cached = [r.usage.cached_prompt_tokens for r in (bypass, salted, salted_again, other_salt, adapted, adapted_again)]  # type: ignore[union-attr]
    assert cached == [0, 0, 32, 0, 0, 32]


async def test_kv_events_describe_the_real_allocations(tmp_path: object) -> None:
    async with engine() as backend:
        events = backend.kv_events()
        await generate(backend, prompt=PROMPT, stopping=Stopping(max_tokens=1))
        await generate(backend, prompt=PROMPT, stopping=Stopping(max_tokens=1))  # a hit: stores nothing new
        await backend.load_lora(LoraAdapter(9, "nine", str(tmp_path)))
        await generate(backend, prompt=PROMPT, lora_name="nine", stopping=Stopping(max_tokens=1))
        await backend.unload_lora(LoraAdapter(9, "nine", str(tmp_path)))
        batches = [kv_batch_to_proto(batch) for batch in await drain(events)]
    tokens = encode(PROMPT)
    first = block_hash(CacheKey().root, tokens[:16])
    second = block_hash(first, tokens[16:32])
    base, adapted, removed = batches
    assert all(b.sequence_number == 0 and b.data_parallel_rank == 0 for b in batches)
    stored = base.events[0].block_stored
    assert [h.value for h in stored.block_hashes] == [BlockHash.of(first).value, BlockHash.of(second).value]
    assert list(stored.token_ids) == tokens[:32] and stored.block_size == 16 and stored.lora_id == 0
    lora_stored = adapted.events[0].block_stored
    assert (lora_stored.lora_id, lora_stored.lora_name) == (9, "nine")
    assert lora_stored.block_hashes[0].value != stored.block_hashes[0].value
    assert [h.value for h in removed.events[0].block_removed.block_hashes] == [
        h.value for h in lora_stored.block_hashes
    ]


async def test_eviction_under_pressure_publishes_removals() -> None:
    async with engine(total_kv_blocks=8, kv_block_size=8, max_context_length=64, max_output_tokens=8) as backend:
        events = backend.kv_events()
        for word in ("alpha", "bravo", "charlie", "delta"):
            await generate(backend, prompt=f"{word}: {PROMPT[:30]}", stopping=Stopping(max_tokens=1))
        batches = [kv_batch_to_proto(batch) for batch in await drain(events)]
        load = await backend.load()
    kinds = [e.WhichOneof("event") for b in batches for e in b.events]
    assert "block_removed" in kinds
    assert load.used_kv_blocks == 0 and backend.cores[0].kv.cached <= 8


async def test_abort_frees_blocks_and_ends_the_stream() -> None:
    async with engine(decode_time_per_step_s=0.01) as backend:
        stream = backend.generate(
            request(request_id="long", prompt=PROMPT, stopping=Stopping(max_tokens=500, ignore_eos=True))
        )
        other = backend.generate(request(request_id="other", prompt=PROMPT))
        await asyncio.sleep(0.05)
        load = await backend.load()
        assert load.running_requests == 2 and load.used_kv_blocks > 0
        await backend.abort("long")
        await backend.abort("long")  # idempotent
        await backend.abort("other")
        assert stream.cancelled and other.cancelled
        for ended in (stream, other):  # only the usage is left, for the final response to count
            assert [type(e) for e in [e async for e in ended]] == [UsageReport]
        load = await backend.load()
        await backend.abort("never-seen")
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)
    assert (backend.cores[0].accepted, backend.cores[0].aborted) == (2, 2)  # each counted once


async def test_outputs_share_their_prompt_blocks() -> None:
    async with engine(decode_time_per_step_s=0.2) as backend:
        stream = backend.generate(
            request(prompt=PROMPT, sampling=Sampling(num_sequences=4), stopping=Stopping(max_tokens=2))
        )
        await asyncio.sleep(0.02)  # prompt computed once, a token sampled per output; one decode step runs
        load = await backend.load()
        assert [e async for e in stream]
    assert load.used_kv_blocks == 2 + 4  # two shared full blocks, one own partial block per output
    assert load.running_tokens == 4 * 47


async def test_load_reports_queue_tokens_and_batches() -> None:
    async with engine(decode_time_per_step_s=0.01, max_running_requests=1) as backend:
        streams = [
            backend.generate(request(prompt=PROMPT, stopping=Stopping(max_tokens=200, ignore_eos=True)))
            for _ in range(3)
        ]
        await asyncio.sleep(0.05)
        load = await backend.load()
        for stream in streams:
            stream.cancel()
        for core in backend.cores:
            for pending in [*core.running, *core.waiting]:
                await backend.abort(pending.request_id)
    assert (load.running_requests, load.queued_requests) == (1, 2)
    assert load.waiting_tokens == 2 * 46 and load.running_tokens > 46
    assert (load.prefill_batch_size, load.decode_batch_size) == (0, 1)
    assert load.used_kv_blocks >= 3 and load.total_kv_blocks == 1024
    for name in ("active_kv_sessions", "running_requests", "prefill_batch_size"):
        assert getattr(load, name) is not None
    (rank,) = load.ranks
    assert rank.data_parallel_rank is not None and rank.running_requests == 1 and rank.queued_requests == 2


async def test_priority_orders_the_waiting_queue() -> None:
    async with engine(max_running_requests=1, decode_time_per_step_s=0.002) as backend:
        finished: list[str] = []

        async def consume(name: str, priority: int) -> None:
            async for _ in backend.generate(
                request(request_id=name, priority=priority, stopping=Stopping(max_tokens=5))
            ):
                pass
            finished.append(name)

        first = asyncio.create_task(consume("first", 0))
        await asyncio.sleep(0.001)  # "first" is running; the rest queue behind it
        await asyncio.gather(first, consume("low", -5), consume("high", 9), consume("mid", 1))
    assert finished == ["first", "high", "mid", "low"]


async def test_fifo_without_priority() -> None:
    async with engine(max_running_requests=1, enable_priority=False) as backend:
        finished: list[str] = []

        async def consume(name: str) -> None:
            async for _ in backend.generate(request(request_id=name, stopping=Stopping(max_tokens=3))):
                pass
            finished.append(name)

        await asyncio.gather(*(consume(name) for name in ("a", "b", "c")))
    assert finished == ["a", "b", "c"]


async def test_preemption_recomputes_and_keeps_outputs_exact() -> None:
    small = {"total_kv_blocks": 10, "kv_block_size": 4, "max_context_length": 40, "max_output_tokens": 32}
    greedy = {"sampling": GREEDY, "stopping": Stopping(max_tokens=24, ignore_eos=True)}
    async with engine(**small) as backend:
        alone = [await generate(backend, prompt=f"p{i}", **greedy) for i in range(3)]
    async with engine(**small) as backend:
        events = backend.runtime_events()
        together = await asyncio.gather(*(generate(backend, prompt=f"p{i}", **greedy) for i in range(3)))
        reasons = [e.attributes.get("reason") for e in await drain(events) if e.type == pb.RUNTIME_EVENT_TYPE_QUEUE]
    assert "preempted" in reasons
    assert [r.tokens for r in together] == [r.tokens for r in alone]


async def test_preemption_picks_the_lowest_priority_request() -> None:
    small = {"total_kv_blocks": 10, "kv_block_size": 4, "max_context_length": 40, "max_output_tokens": 32}
    async with engine(**small) as backend:
        events = backend.runtime_events()
        await asyncio.gather(
            *(
                generate(
                    backend,
                    request_id=name,
                    prompt=name,
                    priority=priority,
                    stopping=Stopping(max_tokens=30, ignore_eos=True),
                )
                for name, priority in (("low", 0), ("high", 5))
            )
        )
        batches = [e.attributes for e in await drain(events) if e.type == pb.RUNTIME_EVENT_TYPE_BATCH]
    assert {b["request_id"] for b in batches if b["resumed"] == "True"} == {"low"}


async def test_long_prompts_are_prefilled_in_chunks() -> None:
    async with engine(max_batched_tokens=8) as backend:
        events = backend.runtime_events()
        chunked = await generate(backend, prompt=PROMPT, sampling=GREEDY)
        passes = [e for e in await drain(events) if e.type == pb.RUNTIME_EVENT_TYPE_FORWARD_PASS]
    async with engine() as backend:
        whole = await generate(backend, prompt=PROMPT, sampling=GREEDY)
    assert chunked.tokens == whole.tokens
    prefill = [int(e.attributes["prefill_tokens"]) for e in passes]
    assert max(prefill) == 8 and sum(prefill) == 46


async def test_timing_model_paces_steps() -> None:
    loop = asyncio.get_running_loop()
    async with engine(prefill_time_per_token_s=0.001, decode_time_per_step_s=0.01) as backend:
        started = loop.time()
        await generate(backend, prompt="x" * 99, stopping=Stopping(max_tokens=5, ignore_eos=True))
        elapsed = loop.time() - started
    assert 0.1 + 4 * 0.01 <= elapsed < 1.0


async def test_runtime_events_cover_batches_queue_and_passes() -> None:
    async with engine() as backend:
        events = backend.runtime_events()
        await generate(backend, request_id="seen", stopping=Stopping(max_tokens=2))
        kinds = {e.type: e for e in await drain(events)}
    assert kinds[pb.RUNTIME_EVENT_TYPE_BATCH].attributes["request_id"] == "seen"
    assert kinds[pb.RUNTIME_EVENT_TYPE_QUEUE].attributes["rank"] == "0"
    assert kinds[pb.RUNTIME_EVENT_TYPE_FORWARD_PASS].attributes["decode_tokens"] == "1"


async def test_a_lagging_event_consumer_fails_instead_of_losing_events() -> None:
    async with engine(event_queue_size=2) as backend:
        events = backend.kv_events()
        with pytest.raises(RuntimeError, match="consumer"):
            backend.kv_events()
        for word in ("one", "two", "three", "four"):
            await generate(backend, prompt=f"{word} {PROMPT}", stopping=Stopping(max_tokens=1))
        assert len([await anext(events), await anext(events)]) == 2
        with pytest.raises(EventOverflow):
            await anext(events)


async def test_data_parallel_ranks_are_independent() -> None:
    async with engine(data_parallel_size=2) as backend:
        events = backend.kv_events()
        on_one = await generate(backend, prompt=PROMPT, data_parallel_rank=1)
        again_zero = await generate(backend, prompt=PROMPT, data_parallel_rank=0)
        again_one = await generate(backend, prompt=PROMPT, data_parallel_rank=1)
        batches = await drain(events)
        load = await backend.load()
    assert [r.usage.cached_prompt_tokens for r in (on_one, again_zero, again_one)] == [0, 0, 32]  # type: ignore[union-attr]
    assert {b.data_parallel_rank for b in batches} == {0, 1}
    assert [r.data_parallel_rank for r in load.ranks] == [0, 1] and load.total_kv_blocks == 2048
