"""Load held: 256 concurrent Generate streams for about ten seconds, the mock at engine-like timing.

Each of 256 clients runs one stream after another (closed loop), so the gateway holds about
256 streams the whole while. Every stream must complete and be well formed (``streams.ending``:
one terminal event, usage on the last message and matching the tokens sent) with exactly the
tokens asked for, no call may fail, and the process's resident memory may not grow once warmed
up: a per-stream leak of a few KiB would show. The phases are counted in streams as well as
seconds, so a busy machine makes the run longer rather than the proof weaker.
"""

from __future__ import annotations

import asyncio
import gc
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions

from tests.ops.conftest import Figures
from tests.ops.streams import ending
from tests.ops.support import engine_idle, gateway, wait_until

CLIENTS = 256
WARM_UP_STREAMS = 500
"""Streams completed before memory is first measured: by then the bounded caches are full."""
HOLD_S = 6.0
HOLD_STREAMS = 500
"""The measured phase lasts at least this long and completes at least this many streams."""
GIVE_UP_S = 120.0
ENGINE: dict[str, Any] = {
    "prefill_time_per_token_s": 0.0001,  # a 20-token prompt: 2 ms
    "decode_time_per_step_s": 0.05,  # 20 tokens/s per stream, for the whole batch at once
    "max_running_requests": CLIENTS,  # all of them batched, none queued
    "total_kv_blocks": 2048,  # room for every stream at once; full of cached blocks after the warm-up
}
BUFFERS = GatewayOptions(kv_replay_batches=100, finished_window=256)
"""The KV replay buffer (one batch a step) and the finished-id window are bounded by design,
but at their default sizes they keep filling for minutes; sized to be full after the warm-up,
so that any growth after it is memory that nothing bounds."""
MAX_GROWTH_BYTES = 2 * 2**20
"""Resident memory growth allowed over the measured phase: under 4 KiB for each of its 500+
streams (measured: flat to within 0.5 MiB; a 4 KiB-per-stream leak fails it)."""


def resident_bytes() -> int:
    """This process's resident set size (``VmRSS``), after a full collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass
class Run:
    """What the clients did, and when the phases changed."""

    completed: int = 0
    tokens: int = 0
    errors: int = 0
    measuring: bool = False
    held_streams: int = 0
    held_tokens: int = 0
    stop: bool = False


async def test_load_held(figures: Figures) -> None:
    async with gateway(options=BUFFERS, **ENGINE) as running:
        stub = pb.OpenEngineStub(running.channel)
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        rng = random.Random(7)
        loop = asyncio.get_running_loop()
        run = Run()
        problems: list[str] = []

        async def client(number: int) -> None:
            while not run.stop:
                max_tokens = rng.randint(16, 96)
                request = pb.GenerateRequest(
                    model="mock",
                    prompt=f"client {number} says: the quick brown fox",
                    stopping=pb.StoppingOptions(max_tokens=max_tokens, ignore_eos=True),
                )
                try:
                    responses = [response async for response in stub.Generate(request, timeout=60)]
                except grpc.aio.AioRpcError as error:
                    problems.append(f"{error.code().name}: {error.details()}")
                    continue
                result = ending(responses)
                if result.error is not None or result.reasons != {0: pb.FINISH_REASON_LENGTH}:
                    problems.append(f"ended with {result.error or result.reasons}")
                elif result.tokens != max_tokens:
                    problems.append(f"{result.tokens} tokens of {max_tokens}")
                run.completed += 1
                run.tokens += result.tokens
                if run.measuring:
                    run.held_streams += 1
                    run.held_tokens += result.tokens

        async def measure() -> tuple[int, int, list[int], float]:
            """Memory when the warm-up ends and when the measured phase does, streams in flight
            every 100 ms between, and how long the phase lasted."""
            give_up = loop.time() + GIVE_UP_S
            await wait_until(lambda: run.completed >= WARM_UP_STREAMS, within_s=GIVE_UP_S, what="the warm-up")
            warm = resident_bytes()
            began = loop.time()
            run.measuring = True
            in_flight = []
            while (loop.time() < began + HOLD_S or run.held_streams < HOLD_STREAMS) and loop.time() < give_up:
                in_flight.append(len(running.gateway.registry))
                await asyncio.sleep(0.1)
            run.measuring = False
            lasted = loop.time() - began
            end = resident_bytes()  # still under full load, as after the warm-up
            run.stop = True
            return warm, end, in_flight, lasted

        clients = asyncio.gather(*(client(number) for number in range(CLIENTS)))
        (warm, end, in_flight, lasted), _ = await asyncio.gather(measure(), clients)
        await wait_until(lambda: len(running.gateway.registry) == 0, what="no request in flight")
        await wait_until(lambda: engine_idle(backend), what="the engine idles")

    growth = end - warm
    held_open = sum(in_flight) / len(in_flight)
    assert problems == [], problems[:5]
    assert run.held_streams >= HOLD_STREAMS, f"gave up after {run.held_streams} measured streams"
    assert held_open >= CLIENTS * 0.6, f"on average only {held_open:.0f} streams open"
    assert growth < MAX_GROWTH_BYTES, f"resident memory grew {growth / 2**20:.1f} MiB under steady load"
    figures.record("load: streams completed", f"{run.completed} by {CLIENTS} concurrent clients")
    figures.record(
        "load: measured phase", f"{run.held_streams} streams in {lasted:.1f}s after {WARM_UP_STREAMS} to warm up"
    )
    figures.record("load: streams in flight while measured", f"{held_open:.0f} on average, {min(in_flight)} at least")
    figures.record("load: tokens/s while measured", f"{run.held_tokens / lasted:.0f}")
    figures.record("load: errors", len(problems))
    figures.record(
        "load: resident memory growth while measured",
        f"{growth / 2**20:+.1f} MiB (bound {MAX_GROWTH_BYTES / 2**20:g} MiB; {end / 2**20:.0f} MiB resident)",
    )
