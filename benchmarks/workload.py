"""The client side of every benchmark: closed-loop concurrent streams, timed the same way for every server.

A server under test is reduced to a ``StreamCall``: a function that starts request ``n`` and yields the
number of tokens in each streamed message. ``run`` keeps ``concurrency`` such streams in flight until
``requests`` have been made and records, per request, the time to its first token, so the gateway,
a bare gRPC server, vLLM's HTTP server and ``AsyncLLM`` in process are all measured by one loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from openengine_gateway import pb

StreamCall = Callable[[int], AsyncIterator[int]]
"""Starts request ``n``; yields each streamed message's token count (0 for a message without tokens)."""
Generate = grpc.aio.UnaryStreamMultiCallable[pb.GenerateRequest, pb.GenerateResponse]
"""The OpenEngine ``Generate`` method of a channel."""


@dataclass
class RunResult:
    """What one closed-loop run observed at the client."""

    wall_s: float = 0.0
    tokens: int = 0
    messages: int = 0
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    arrivals_s: list[list[float]] = field(default_factory=list)
    """With ``run(trace=True)``: per completed request, when each message with tokens arrived (seconds after
    the request started), for inter-token latencies."""

    @property
    def tokens_per_s(self) -> float:
        """Streamed tokens per second of wall time."""
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def messages_per_s(self) -> float:
        """Streamed messages per second of wall time."""
        return self.messages / self.wall_s if self.wall_s else 0.0


async def run(
    call: StreamCall, *, concurrency: int, requests: int, trace: bool = False, ramp_s: float = 0.0
) -> RunResult:
    """Make ``requests`` calls, ``concurrency`` at a time, each worker starting its next when one ends;
    ``trace`` keeps every token message's arrival time too; ``ramp_s`` spreads the workers' first calls
    evenly over that many seconds (a server takes thousands of streams started at once less well than
    the same streams arriving over a second or two)."""
    result = RunResult()
    numbers = iter(range(requests))
    workers = min(concurrency, requests)

    async def worker(index: int) -> None:
        if ramp_s:
            await asyncio.sleep(ramp_s * index / workers)
        for number in numbers:
            started = time.perf_counter()
            first = True
            arrivals: list[float] = []
            try:
                async for tokens in call(number):
                    result.messages += 1
                    result.tokens += tokens
                    if tokens and (first or trace):
                        now = time.perf_counter() - started
                        if first:
                            result.ttft_s.append(now)
                            first = False
                        if trace:
                            arrivals.append(now)
                result.completed += 1
                if trace:
                    result.arrivals_s.append(arrivals)
            except Exception as exc:  # broad on purpose: every failure is counted and reported, not raised
                result.errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    await asyncio.gather(*(worker(index) for index in range(workers)))
    result.wall_s = time.perf_counter() - started
    return result


def generate_method(channel: grpc.aio.Channel) -> Generate:
    """``Generate`` on ``channel``, as ``pb.OpenEngineStub`` builds it, typed as the async call it is."""
    return channel.unary_stream(
        f"/{pb.SERVICE_NAME}/Generate",
        request_serializer=pb.GenerateRequest.SerializeToString,
        response_deserializer=pb.GenerateResponse.FromString,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


__all__ = ["Generate", "RunResult", "StreamCall", "generate_method", "percentile", "run"]
