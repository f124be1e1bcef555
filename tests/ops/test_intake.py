"""A burst of calls larger than gRPC's default queue of calls not yet taken by the server.

grpc.aio takes one new call per event-loop turn, so a burst waits in gRPC's queue; with gRPC's
defaults (1,000 soft, 3,000 hard) calls past them are CANCELLED before the gateway sees them. The
gateway bounds that queue at its own admission limit instead (``server.app``): every call of a
burst within ``max_in_flight`` is served.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
from openengine_gateway import pb

from tests.ops.support import gateway

BURST = 2500


async def test_a_burst_within_the_admission_limit_is_served_whole() -> None:
    async with gateway(decode_time_per_step_s=0.0, prefill_time_per_token_s=0.0, max_running_requests=1024) as running:
        stub = pb.OpenEngineStub(running.channel)
        stopping = pb.StoppingOptions(max_tokens=1, ignore_eos=True)

        async def one(number: int) -> grpc.StatusCode:
            call = stub.Generate(
                pb.GenerateRequest(request_id=f"burst-{number}", model="mock", prompt="hi", stopping=stopping)
            )
            async for _ in call:
                pass
            return await call.code()

        codes = Counter(await asyncio.gather(*(one(n) for n in range(BURST)), return_exceptions=False))
    assert codes == {grpc.StatusCode.OK: BURST}, codes
