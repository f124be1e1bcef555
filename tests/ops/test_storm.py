"""A cancellation storm: thousands of Generate streams, each left by its client at a random point.

Every way a stream can end early, mixed under bounded concurrency: cancelled before its first
token was read (before the call even left, or once it was in flight, queued or running in the
engine), cancelled mid-stream, ended by an expiring deadline, and stopped by ``Abort`` of its
request id. None is allowed to finish on its own
(``max_tokens`` far beyond any cancellation point), so afterwards every request the engine
accepted must have been aborted in the engine, exactly once, and nothing may be left: no
request in flight in the gateway, none running or queued in the engine, no KV block held.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator

import grpc
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.core.registry import RequestRegistry

from tests.ops.conftest import Figures
from tests.ops.streams import ending
from tests.ops.support import engine_idle, gateway, wait_until

STREAMS = 2000
CONCURRENCY = 128
"""Streams open at once; twice the mock's running limit (64), so some are cancelled while queued."""
STEP_S = 0.001
"""The mock's decode step: small, but every stream really runs for a while."""
MODES = ("before the first token", "mid-stream", "deadline", "abort")


def generate(request_id: str) -> pb.GenerateRequest:
    """A request that runs far longer than any stream of the storm lives (1000 steps)."""
    stopping = pb.StoppingOptions(max_tokens=1000, ignore_eos=True)
    return pb.GenerateRequest(request_id=request_id, model="mock", prompt="the storm", stopping=stopping)


async def leave(
    channel: grpc.aio.Channel, registry: RequestRegistry, index: int, rng: random.Random
) -> tuple[str, bool]:
    """Run stream ``index`` and leave it the way its number says; returns the mode and whether
    the gateway had certainly accepted it (it sent a message, or was seen in flight)."""
    stub = pb.OpenEngineStub(channel)
    mode = MODES[index % len(MODES)]
    request_id = f"storm-{index}"
    if mode == "before the first token":
        call = stub.Generate(generate(request_id))
        accepted = rng.random() < 0.5
        if accepted:  # in flight (queued or running in the engine), its first token unread
            await wait_until(lambda: registry.get(request_id) is not None, what=f"{request_id} in flight")
        else:  # from not yet sent to just arrived
            await asyncio.sleep(rng.choice((0, 0.001, 0.005)))
        call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED
        return mode, accepted
    if mode == "deadline":
        # Under the storm's load a call waits a while to be served; at 1 ms a step and 1000
        # tokens no stream can finish before even the longest deadline.
        call = stub.Generate(generate(request_id), timeout=rng.uniform(0.005, 0.8))
        received = 0
        try:
            async for _ in call:
                received += 1
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
        else:
            raise AssertionError("a stream outlived its deadline")
        return mode, received > 0
    call = stub.Generate(generate(request_id))
    responses = [await call.read() for _ in range(rng.randint(1, 20))]
    assert all(isinstance(r, pb.GenerateResponse) and r.HasField("token") for r in responses), responses
    if mode == "mid-stream":
        call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED
        return mode, True
    aborted = await stub.Abort(pb.AbortRequest(request_id=request_id))
    assert aborted.status == pb.ABORT_STATUS_ABORTED, aborted
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    end = ending(responses)
    assert end.error is None and end.reasons == {0: pb.FINISH_REASON_CANCELLED}, end
    assert await call.code() == grpc.StatusCode.OK
    return mode, True


async def test_a_cancellation_storm_leaves_nothing_behind(figures: Figures) -> None:
    async with gateway(decode_time_per_step_s=STEP_S, prefill_time_per_token_s=0.0) as running:
        stub = pb.OpenEngineStub(running.channel)
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        rng = random.Random(20240607)
        numbers: Iterator[int] = iter(range(STREAMS))
        modes: Counter[str] = Counter()
        seen_accepted: Counter[str] = Counter()

        async def worker() -> None:
            for index in numbers:
                mode, accepted = await leave(running.channel, running.gateway.registry, index, rng)
                modes[mode] += 1
                seen_accepted[mode] += accepted

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        stormed_s = time.perf_counter() - started

        registry = running.gateway.registry
        await wait_until(lambda: len(registry) == 0, within_s=10, what="no request in flight")
        await wait_until(lambda: engine_idle(backend), within_s=10, what="the engine idles")
        accepted = sum(core.accepted for core in backend.cores)
        aborted = sum(core.aborted for core in backend.cores)
        left = sum(len(core.running) + len(core.waiting) for core in backend.cores)
        held = sum(core.kv.used for core in backend.cores)
        outcomes = running.gateway.telemetry.outcomes

        share = STREAMS // len(MODES)
        assert sum(modes.values()) == STREAMS and set(modes.values()) == {share}
        assert seen_accepted["mid-stream"] == seen_accepted["abort"] == share
        assert 0 < seen_accepted["before the first token"] < share  # some cancelled before reaching it
        assert seen_accepted["deadline"] > 0  # some expired mid-stream (others before their first token)
        assert accepted >= sum(seen_accepted.values())
        assert aborted == accepted, f"{accepted - aborted} engine requests ended without an abort"
        assert (left, held) == (0, 0)
        assert all(core.kv.free == core.kv.num_blocks for core in backend.cores)
        assert outcomes["generate", "finished"] == outcomes["generate", "failed"] == 0
        assert outcomes["generate", "aborted"] == modes["abort"]
        assert outcomes["generate", "cancelled"] + outcomes["generate", "aborted"] == accepted

        after = [response async for response in stub.Generate(pb.GenerateRequest(model="mock", prompt="calm"))]
        assert ending(after).error is None  # and the gateway still serves

    figures.record("storm: streams cancelled", f"{STREAMS} in {stormed_s:.1f}s, {share} each way ({', '.join(MODES)})")
    figures.record("storm: of them seen accepted before they were left", dict(seen_accepted))
    figures.record("storm: engine requests accepted, all aborted in the engine", f"{accepted}, {aborted}")
    figures.record("storm: in-flight requests after", len(registry))
    figures.record("storm: engine requests left (running + queued)", left)
    figures.record("storm: KV blocks held after", held)
