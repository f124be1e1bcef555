"""Goal 5, scale: thousands of concurrent streams on the null engine, none starved, idle streams' memory bounded.

    python -m benchmarks.scale [--streams 4096] [--clients 2] [--quick]

The gateway over the null engine (``benchmarks.null_engine``: the whole gateway, no engine work) serves
``--streams`` concurrent streams of 128 tokens three ways: at full speed (a token for every stream on
every loop turn, so the gateway coalesces what a client has not read yet), paced (a step every
``Sizes.step_s``), both with the streams arriving at ``ARRIVALS_PER_S``, and at full speed with every
stream started at once (a burst). The streams come from ``--clients`` client processes (this module with
``--client``), each on ``CHANNELS`` HTTP/2 connections of its own, so that no single Python event loop is
the bottleneck; each times its streams with ``workload.run`` and hands every token message's arrival
back. Then the resident memory of idle streams: streams held open while the engine never steps (the null
engine sleeping an hour; ``gateway_ceiling``'s mock engine with an hour of prefill), at a quarter of
``--streams`` and at ``--streams``, so that the bytes per stream show whether memory grows linearly.

Limits met on the way (benchmarks/README.md): the gateway admits ``max_in_flight`` streams (4,096 by
default; the benchmark sets twice ``--streams``, so one run's streams never meet the previous run's last
ones at the limit); gRPC's server sets no limit on concurrent HTTP/2 streams per connection, but cancels
calls its application has not yet taken once more than ``grpc.server.max_pending_requests`` (1,000, at
random up to a hard 3,000) are waiting, which is what a burst of thousands meets.

Targets: every stream completes with all its tokens and no error; no stream starved (the slowest
stream's median inter-token gap at most ``STARVED`` times the median over all streams); idle streams'
memory linear (bytes per stream at ``--streams`` at most ``LINEAR`` times those at a quarter of it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import uvloop

from . import report
from .bare_server import write_messages
from .gateway_ceiling import MAX_TOKENS, open_stream_bytes, record, request, start_bare, start_gateway, start_null
from .processes import Server, python
from .workload import generate_method, percentile, run

ARRIVALS_PER_S = 2000.0
"""New streams a second (ramped runs): what the gateway accepts on a shared 2-core machine with room to spare."""
STARVED = 5.0
LINEAR = 1.5
CHANNELS = 2
"""HTTP/2 connections per client process."""
HOUR_S = 3600.0


@dataclass(frozen=True)
class Sizes:
    """How much each run measures."""

    streams: int = 4096
    """Concurrent streams in each run; idle streams held for the memory figure (and a quarter of them)."""
    step_s: float = 0.05
    """The paced engine's step: 20 tokens/s a stream, 82k tokens/s over 4,096 streams, more than the
    gateway streams on two cores, so the paced run is a load test too."""


QUICK = Sizes(streams=256, step_s=0.005)
"""``--quick``: every run, small enough for a smoke test (the figures mean little)."""


@dataclass
class Load:
    """One run's streams from every client process, pooled, and the gateway's process around it."""

    streams: int
    wall_s: float = 0.0
    tokens: int = 0
    messages: int = 0
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    timelines: list[list[float]] = field(default_factory=list)
    """Per completed stream: when it started, then when each token message arrived (seconds, one clock)."""
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    rss_bytes: tuple[int, int, int] = (0, 0, 0)
    """The gateway's resident memory before, at its peak (sampled every 0.1 s) and after."""

    def add(self, part: dict[str, Any]) -> None:
        """Pool one client's report."""
        self.tokens += part["tokens"]
        self.messages += part["messages"]
        self.completed += part["completed"]
        self.errors += part["errors"]
        self.ttft_s += part["ttft_s"]
        self.client_cpu_s += part["cpu_s"]
        self.timelines += [[part["started"] + t for t in times] for times in part["timelines"]]

    def gaps(self) -> list[list[float]]:
        """Per stream, the gaps between its token messages."""
        return [[b - a for a, b in itertools.pairwise(times[1:])] for times in self.timelines]

    def open_at_once(self) -> int:
        """The most streams open (started, last token message not yet in) at one instant."""
        edges = sorted(edge for times in self.timelines for edge in ((times[0], 1), (times[-1], -1)))
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most


async def client_main(address: str, first: int, count: int, run_id: int, ramp_s: float) -> dict[str, Any]:
    """One client process: ``count`` streams (request numbers from ``first``) started when stdin says go;
    what it saw."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(CHANNELS)]
    for channel in channels:
        await channel.channel_ready()
    methods = [generate_method(channel) for channel in channels]
    timelines: list[list[float]] = []

    async def call(number: int) -> AsyncIterator[int]:
        times = [time.perf_counter()]
        async for response in methods[number % CHANNELS](request(run_id, first + number)):
            tokens = len(response.token.tokens)
            if tokens:
                times.append(time.perf_counter())
            yield tokens
        timelines.append(times)  # reached only by a stream that ended without error

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started, clock, cpu = time.time(), time.perf_counter(), time.process_time()
    result = await run(call, concurrency=count, requests=count, ramp_s=ramp_s)
    part = {
        "started": started,
        "wall_s": result.wall_s,
        "cpu_s": time.process_time() - cpu,
        "tokens": result.tokens,
        "messages": result.messages,
        "completed": result.completed,
        "errors": result.errors,
        "ttft_s": result.ttft_s,
        "timelines": [[round(t - clock, 6) for t in times] for times in timelines],
    }
    for channel in channels:
        await channel.close()
    return part


async def drive(server: Server, streams: int, clients: int, ramp_s: float, run_id: int, directory: Path) -> Load:
    """``streams`` streams from ``clients`` client processes, which start together once all are connected."""
    shares = [streams // clients + (1 if n < streams % clients else 0) for n in range(clients)]
    outs = [directory / f"client-{run_id}-{n}.json" for n in range(clients)]
    processes = []
    for n, (count, out) in enumerate(zip(shares, outs, strict=True)):
        argv = python("-m", "benchmarks.scale", "--client", server.address, "--first", str(sum(shares[:n])))
        argv += ["--count", str(count), "--run-id", str(run_id), "--ramp-s", str(ramp_s), "--out", str(out)]
        processes.append(
            await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        )
    for process in processes:
        assert process.stdout is not None and process.stdin is not None
        if (await process.stdout.readline()).strip() != b"ready":
            raise RuntimeError(f"a client process did not connect to {server.address}")
    before, cpu = server.rss_bytes(), server.cpu_s()
    peak = before
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await process.stdin.drain()
    waits = [asyncio.ensure_future(process.wait()) for process in processes]
    while not all(wait.done() for wait in waits):
        peak = max(peak, server.rss_bytes())
        await asyncio.wait(waits, timeout=0.1)
    await asyncio.sleep(0.5)  # the gateway's per-stream cleanup, before its clock and memory are read
    load = Load(streams, server_cpu_s=server.cpu_s() - cpu, rss_bytes=(before, peak, server.rss_bytes()))
    if any(process.returncode for process in processes):
        raise RuntimeError(f"a client process failed: exit {[process.returncode for process in processes]}")
    parts = [json.loads(out.read_text()) for out in outs]
    for part in parts:
        load.add(part)
    load.wall_s = max(p["started"] + p["wall_s"] for p in parts) - min(p["started"] for p in parts)
    return load


def _mib(size: float) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _spread(values: Sequence[float]) -> str:
    return " / ".join(report.ms(v) for v in (percentile(values, 50), percentile(values, 99), max(values, default=0)))


def load_report(title: str, load: Load, *, paced: bool) -> list[bool]:
    """Print one run's figures; whether it met each target (a paced run's median ITL too)."""
    report.section(title)
    expected = load.streams * MAX_TOKENS
    complete = load.completed == load.streams and not load.errors
    report.line(
        "streams completed",
        f"{load.completed}/{load.streams}, {len(load.errors)} errors",
        report.target(complete, "all complete, no errors"),
    )
    report.line("tokens delivered", f"{load.tokens:,}/{expected:,}", report.target(load.tokens == expected, "all"))
    for error in sorted({error.replace("\n", " ") for error in load.errors})[:2]:
        report.line("", f"error: {error[:160]}")
    report.line(
        "throughput",
        f"{load.tokens / load.wall_s:,.0f} tokens/s, {load.messages / load.wall_s:,.0f} msg/s, "
        f"{load.tokens / max(1, load.messages):.2f} tokens/msg, {load.wall_s:.2f} s",
    )
    report.line("streams open at once (start to last token)", f"{load.open_at_once()} of {load.completed} completed")
    report.line("TTFT p50 / p99 / max", _spread(load.ttft_s))
    gaps = load.gaps()
    pooled = [gap for stream in gaps for gap in stream]
    report.line("ITL (per token message) p50 / p99 / max", _spread(pooled))
    overall = percentile(pooled, 50)
    worst = max((statistics.median(stream) for stream in gaps if stream), default=0.0)
    fair = worst <= STARVED * overall
    verdict = report.target(fair, f"<= {STARVED:.0f}x the median") if paced else "(coalesced: no target)"
    report.line("slowest stream's median ITL", f"{report.ms(worst)} ({worst / overall:.1f}x the median)", verdict)
    done = [times[-1] - times[0] for times in load.timelines]
    middle, slowest = percentile(done, 50), max(done, default=0.0)
    served = slowest <= STARVED * middle
    report.line(
        "stream start to last token: median, slowest",
        f"{middle:.2f} s, {slowest:.2f} s ({slowest / middle:.1f}x)",
        report.target(served, f"<= {STARVED:.0f}x the median"),
    )
    before, peak, after = load.rss_bytes
    report.line(
        "gateway process",
        f"{load.server_cpu_s:.1f} CPU s ({load.server_cpu_s / load.wall_s:.0%} of a core); "
        f"RSS {_mib(before)} -> peak {_mib(peak)} -> {_mib(after)}",
    )
    report.line("client processes", f"{load.client_cpu_s:.1f} CPU s")
    return [complete and load.tokens == expected, served] + ([fair] if paced else [])


async def streaming(directory: Path, messages: Path, sizes: Sizes, clients: int) -> list[bool]:
    """The three runs, after a warm-up run on each server; whether each met its targets."""
    streams = sizes.streams
    limit = ("--max-in-flight", str(2 * streams))
    ramp_s = streams / ARRIVALS_PER_S
    warm = min(streams // 4, 512)
    shape = f"{streams} streams x {MAX_TOKENS} tokens from {clients} processes"
    runs: dict[float, list[tuple[str, float]]] = {
        0.0: [
            (f"{shape}, arriving over {ramp_s:.1f} s: null engine at full speed", ramp_s),
            (f"{shape}, started at once: null engine at full speed", 0.0),
        ],
        sizes.step_s: [(f"{shape}, arriving over {ramp_s:.1f} s: null engine, a step every {sizes.step_s} s", ramp_s)],
    }
    passed: list[bool] = []
    run_ids = iter(range(1000))
    for step_s, measured in runs.items():
        server = start_null(messages, directory / f"null-{step_s}.log", "--step-s", str(step_s), *limit)
        try:
            await drive(server, warm, clients, warm / ARRIVALS_PER_S, next(run_ids), directory)
            for title, ramp in measured:
                load = await drive(server, streams, clients, ramp, next(run_ids), directory)
                passed += load_report(title, load, paced=step_s > 0)
        finally:
            server.stop()
    return passed


async def idle_bytes(start: Callable[[], Server], count: int) -> tuple[float, int]:
    """Resident bytes per idle stream of a freshly started server, ``count`` streams started (at
    ``ARRIVALS_PER_S``); how many it held open."""
    server = start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            return await open_stream_bytes(server, generate_method(channel), count, per_s=ARRIVALS_PER_S)
    finally:
        server.stop()


async def memory(directory: Path, messages: Path, streams: int) -> list[bool]:
    """Bytes per idle stream at a quarter of ``streams`` and at ``streams``; whether they grow linearly."""
    limit = 2 * streams
    starts: dict[str, Callable[[], Server]] = {
        # The step loop's first turn comes with the warm-up's streams; the next one an hour later.
        "null engine": lambda: start_null(
            messages, directory / "null-idle.log", "--step-s", str(HOUR_S), "--max-in-flight", str(limit)
        ),
        # gateway_ceiling's figure: the mock engine's first prefill step never ends.
        "mock engine": lambda: start_gateway(
            directory / "mock-idle.log", prefill_time_per_token_s=HOUR_S, max_in_flight=limit
        ),
    }
    report.section("resident memory per idle stream (held open, no token yet; after a warm-up)")
    passed: list[bool] = []
    per_stream: dict[str, float] = {}
    for name, start in starts.items():
        figures: dict[int, float] = {}
        for count in (streams // 4, streams):
            figures[count], held = await idle_bytes(start, count)
            report.line(
                f"{name}, {count} streams started",
                f"{held} held, {figures[count] / 1024:.1f} KiB/stream, {_mib(figures[count] * held)} in all",
                report.target(held == count, "all held"),
            )
            passed.append(held == count)
        small, large = figures[streams // 4], figures[streams]
        per_stream[name] = large
        linear = large <= LINEAR * small
        report.line(
            f"  {streams} against {streams // 4}",
            f"{large / small:.2f}x the bytes per stream",
            report.target(linear, f"<= {LINEAR}x: linear"),
        )
        passed.append(linear)
    bare, held = await idle_bytes(lambda: start_bare(messages, directory / "bare-hold.log", hold=True), streams)
    report.line(f"bare grpc.aio server, {streams} streams started", f"{held} held, {bare / 1024:.1f} KiB/stream")
    own = per_stream["null engine"] - bare
    report.line("  the gateway's own (null engine - bare)", f"{own / 1024:.1f} KiB/stream")
    return passed


async def main(sizes: Sizes, clients: int) -> None:
    """Record the stream, run the streams, measure idle memory, print."""
    report.header(f"scale: {sizes.streams} concurrent streams on the null engine")
    with tempfile.TemporaryDirectory(prefix="scale-") as temporary:
        directory = Path(temporary)
        messages = directory / "stream.bin"
        write_messages(messages, await record(directory))
        passed = await streaming(directory, messages, sizes, clients)
        passed += await memory(directory, messages, sizes.streams)
    report.section("verdict")
    report.line("scale targets met", f"{sum(passed)} of {len(passed)}", report.target(all(passed), "all"))


def cli() -> None:
    """Entry point: ``python -m benchmarks.scale``."""
    parser = argparse.ArgumentParser(description="Thousands of concurrent streams on the null engine.")
    parser.add_argument("--streams", type=int, default=4096, help="concurrent streams (default 4096)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--quick", action="store_true", help="256 streams: checks the program, not the gateway")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ramp-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        part = uvloop.run(client_main(args.client, args.first, args.count, args.run_id, args.ramp_s))
        args.out.write_text(json.dumps(part))
    else:
        uvloop.run(main(QUICK if args.quick else Sizes(args.streams), args.clients))


if __name__ == "__main__":
    cli()
