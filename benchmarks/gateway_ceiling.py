"""The gateway's own cost: the gateway on a zero-cost engine against a bare grpc.aio server, in one run.

    python -m benchmarks.gateway_ceiling [--rounds 5] [--quick]

Four processes: the gateway (``openengine-gateway --backend mock`` at zero step time); the ceiling
(``benchmarks.bare_server``: Generate alone, streaming pre-built messages); the gateway over a null
engine (``benchmarks.null_engine``: the same tokens with no engine work at all); and this client, which
drives them with one workload, alternating the order round by round so machine noise falls on all alike.

The bare server's messages come from one real gateway stream (recorded from a gateway whose engine takes
2 ms a step, so each message carries one token), merged into as many messages per stream as the gateway
under test sent in its latest run at the same concurrency: a zero-cost engine outruns any client, so the
gateway coalesces, and the ceiling sends the same bytes in the same number of messages. The kernel's CPU
accounting of each server process gives CPU per message; the null engine against the bare server gives
the gateway's own share, the mock engine against the null engine the mock engine's.

Targets: streamed tokens/s at least 0.9 of the bare ceiling; at most 30 us of gateway CPU per message
beyond the bare server's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import statistics
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import uvloop
from openengine_gateway import pb
from openengine_gateway.client import text_request

from . import report
from .bare_server import CHUNKS_KEY, write_messages
from .processes import Server, python
from .workload import Generate, RunResult, StreamCall, generate_method, percentile, run

MAX_TOKENS = 128
PROMPT = "the quick brown fox"


@dataclass(frozen=True)
class Sizes:
    """How much each measurement runs."""

    concurrency: int = 256
    """Streams at once in the throughput runs."""
    requests: int = 1024
    """Streams per throughput run."""
    single: int = 64
    """Streams per concurrency-1 run (TTFT)."""
    burst: int = 1000
    """Streams started at once in the burst."""
    open_streams: int = 1000
    """Paused streams held open for the memory figure."""


FULL = Sizes()
QUICK = Sizes(concurrency=16, requests=64, single=8, burst=100, open_streams=100)
"""``--quick``: every measurement, small enough for a smoke test (the figures mean little)."""

THROUGHPUT_TARGET = 0.85
"""Issue 25: the gateway over the null engine streams at least this share of the bare server's rate."""
CPU_TARGET_US = 15.0
"""Issue 25: the gateway's own CPU per message over the null engine, beyond the bare server's."""
NULL_STEP_S = 0.001
"""The null engine's step. At zero its loop would spin the gateway's event loop (a poll with no timeout every
turn), CPU that no engine in a process of its own costs the gateway: a bare server with the same spinning loop
beside it measured as much as the whole gateway. Every 1 ms it still has a token ready for each stream far
more often than any stream is sent one (its messages carry several)."""

MOCK_OPTIONS: dict[str, object] = {
    "max_running_requests": 1024,
    "total_kv_blocks": 32768,
    "enable_kv_events": False,
    "enable_runtime_events": False,
}
"""Room for 1,000 concurrent streams; no KV or runtime events (nothing subscribes: a zero-cost engine)."""

TEMPLATE = text_request(PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
_RUNS = itertools.count()
_TTFT = re.compile(r"^openengine_gateway_time_to_first_token_seconds_(sum|count) (\S+)$", re.MULTILINE)


def _flags(options: dict[str, object]) -> list[str]:
    """Driver options as ``openengine-gateway`` flags."""
    flags = []
    for key, value in options.items():
        flags += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def start_gateway(log: Path, **overrides: object) -> Server:
    """``openengine-gateway --backend mock`` in a child process, with its metrics on a free port."""
    argv = python("-m", "openengine_gateway.cli", "--backend", "mock", "--port", "0", "--metrics-port", "0")
    argv += ["--drain-timeout", "0", "--log-level", "WARNING", *_flags({**MOCK_OPTIONS, **overrides})]
    return Server("gateway", argv, log=log, ready="openengine-gateway serving")


def start_bare(messages: Path, log: Path, *, hold: bool = False) -> Server:
    """The bare server streaming ``messages`` in a child process."""
    argv = python("-m", "benchmarks.bare_server", str(messages), *(["--hold"] if hold else []))
    return Server("bare", argv, log=log, ready="listening on")


def start_null(messages: Path, log: Path, *options: str) -> Server:
    """The gateway over the null engine replaying ``messages``, in a child process (``options``: its flags)."""
    argv = python("-m", "benchmarks.null_engine", str(messages), *options)
    return Server("null", argv, log=log, ready="listening on")


def request(run_id: int, number: int) -> pb.GenerateRequest:
    """The workload's request; ids have one length, so every response has the recorded size."""
    message = pb.GenerateRequest()
    message.CopyFrom(TEMPLATE)
    message.request_id = f"r{run_id:04d}n{number:07d}"
    return message


def generate_call(generate: Generate, chunks: int | None = None) -> StreamCall:
    """Generate over gRPC, yielding each message's token count; ``chunks`` sets the bare server's shape."""
    run_id = next(_RUNS)
    metadata = ((CHUNKS_KEY, str(chunks)),) if chunks is not None else None

    async def call(number: int) -> AsyncIterator[int]:
        async for response in generate(request(run_id, number), metadata=metadata):
            yield len(response.token.tokens)

    return call


@dataclass
class Measured:
    """One run against one server: the client's view and both processes' CPU time."""

    result: RunResult
    server_cpu_s: float
    client_cpu_s: float

    @property
    def server_us_per_message(self) -> float:
        """Server CPU microseconds per streamed message."""
        return self.server_cpu_s / self.result.messages * 1e6

    @property
    def server_us_per_token(self) -> float:
        """Server CPU microseconds per streamed token."""
        return self.server_cpu_s / self.result.tokens * 1e6

    @property
    def token_messages(self) -> int:
        """Token messages per stream (every stream also ends with one message without tokens)."""
        result = self.result
        return max(1, round((result.messages - result.completed) / max(1, result.completed)))


async def measure(
    server: Server, generate: Generate, *, concurrency: int, requests: int, chunks: int | None = None
) -> Measured:
    """Run the workload against ``server`` and charge it the CPU time it used meanwhile."""
    server_start, client_start = server.cpu_s(), time.process_time()
    result = await run(generate_call(generate, chunks), concurrency=concurrency, requests=requests)
    await asyncio.sleep(0.2)  # let the server finish its per-stream cleanup before reading its clock
    return Measured(result, server.cpu_s() - server_start, time.process_time() - client_start)


def server_ttft(metrics_port: int) -> tuple[float, float]:
    """The gateway's own TTFT histogram (acceptance to first token message): (sum in seconds, count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {kind: float(value) for kind, value in _TTFT.findall(text)}
    return found["sum"], found["count"]


async def record(directory: Path) -> list[pb.GenerateResponse]:
    """One real gateway stream with one token per message: its engine takes 10 ms a step, so nothing coalesces."""
    paced = start_gateway(directory / "gateway-paced.log", decode_time_per_step_s=0.01)
    try:
        async with grpc.aio.insecure_channel(paced.address) as channel:
            return [response async for response in generate_method(channel)(request(next(_RUNS), 0))]
    finally:
        paced.stop()


async def open_stream_bytes(
    server: Server, generate: Generate, count: int, *, per_s: float | None = None
) -> tuple[float, int]:
    """Resident memory the server grows by per open, paused stream, and how many streams it holds open of
    the ``count`` started (all at once, or ``per_s`` a second): gRPC cancels what its server takes too slowly."""

    async def hold(calls: Sequence[grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]]) -> None:
        await asyncio.sleep(1.0)
        for call in calls:
            call.cancel()
        await asyncio.sleep(1.0)

    run_id = next(_RUNS)
    await hold([generate(request(run_id, n)) for n in range(32)])  # warm-up: first-use allocations
    base = server.rss_bytes()
    calls: list[grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]] = []
    for first in range(0, count, 100):
        calls += [generate(request(run_id, 100 + n)) for n in range(first, min(count, first + 100))]
        if per_s is not None:
            await asyncio.sleep(100 / per_s)
    previous, stable = -1, 0
    for _ in range(80):  # until the resident size holds still for a second (every call accepted)
        await asyncio.sleep(0.25)
        now = server.rss_bytes()
        stable = stable + 1 if abs(now - previous) < 64 << 10 else 0
        previous = now
        if stable >= 4:
            break
    held = sum(not call.done() for call in calls)
    for call in calls:
        call.cancel()
    return (previous - base) / max(1, held), held


def _median(runs: Sequence[Measured], figure: Callable[[Measured], float]) -> float:
    return statistics.median(figure(m) for m in runs)


def _ratio_line(label: str, values: Sequence[float], target_ratio: float | None = None) -> None:
    median = statistics.median(values)
    spread = f"(rounds {min(values):.3f}..{max(values):.3f})"
    verdict = report.target(median >= target_ratio, f">= {target_ratio}x") if target_ratio is not None else ""
    report.line(label, f"{median:.3f}x {spread}", verdict)


def _ttft_lines(concurrency: int, gateway: Sequence[float], bare: Sequence[float]) -> None:
    for q in (50, 99):
        g, b = percentile(gateway, q), percentile(bare, q)
        report.line(
            f"TTFT p{q} at concurrency {concurrency}", f"gateway {report.ms(g)}, bare {report.ms(b)} ({g / b:.2f}x)"
        )


def _many_line(name: str, result: RunResult, streams: int) -> None:
    ok = result.completed == streams and not result.errors
    figure = f"{result.completed}/{streams} complete, {len(result.errors)} errors, {result.wall_s:.2f} s"
    report.line(f"{streams} concurrent streams: {name}", figure, report.target(ok, "all complete, no errors"))
    for error in sorted(set(result.errors))[:3]:
        report.line("", f"error: {error[:200]}")


class Rounds:
    """Alternating runs; each bare run sends the messages of the latest run of the gateway it is the ceiling for."""

    def __init__(self, gateway: Server, null: Server, bare: Server, sizes: Sizes) -> None:
        self.sizes = sizes
        self._servers = {"gateway": gateway, "null": null, "bare": bare}
        self._channels = [grpc.aio.insecure_channel(server.address) for server in self._servers.values()]
        self.methods = {
            name: generate_method(channel) for name, channel in zip(self._servers, self._channels, strict=True)
        }
        self.shape: dict[tuple[str, int], int] = {}
        """(gateway name, concurrency) -> token messages per stream in that gateway's latest run."""
        self.load: dict[str, list[Measured]] = {"gateway": [], "bare": [], "null": [], "bare for null": []}
        self.single: dict[str, list[float]] = {"gateway": [], "bare": []}

    async def one(self, name: str, concurrency: int, requests: int) -> Measured:
        """One run; ``bare`` and ``bare for null`` send the messages of ``gateway`` and ``null``."""
        if name.startswith("bare"):
            ceiling_for = "null" if name == "bare for null" else "gateway"
            chunks = self.shape[ceiling_for, concurrency]
            return await measure(
                self._servers["bare"], self.methods["bare"], concurrency=concurrency, requests=requests, chunks=chunks
            )
        measured = await measure(self._servers[name], self.methods[name], concurrency=concurrency, requests=requests)
        self.shape[name, concurrency] = measured.token_messages
        return measured

    async def run_rounds(self, rounds: int) -> None:
        """Warm up, then ``rounds`` rounds, each in the reverse order of the one before."""
        names, sizes = list(self.load), self.sizes
        for name in names:  # warm-up; a gateway's first runs give the bare server its first shapes
            await self.one(name, 1, sizes.single)
            await self.one(name, sizes.concurrency, sizes.concurrency)
        for number in range(rounds):
            for name in names if number % 2 == 0 else reversed(names):
                if name in self.single:
                    self.single[name] += (await self.one(name, 1, sizes.single)).result.ttft_s
                self.load[name].append(await self.one(name, sizes.concurrency, sizes.requests))

    async def close(self) -> None:
        """Close the channels."""
        for channel in self._channels:
            await channel.close()


def _throughput_report(rounds: Rounds) -> None:
    count, concurrency = len(rounds.load["gateway"]), rounds.sizes.concurrency
    report.section(f"throughput: {count} alternating rounds, {concurrency} streams x {MAX_TOKENS} tokens")
    for name, runs in rounds.load.items():
        report.line(
            name,
            f"{_median(runs, lambda m: m.result.tokens_per_s):,.0f} tokens/s, "
            f"{_median(runs, lambda m: m.result.messages_per_s):,.0f} msg/s, "
            f"{_median(runs, lambda m: m.result.tokens / m.result.messages):.2f} tokens/msg, "
            f"{sum(len(m.result.errors) for m in runs)} errors",
        )

    def ratios(top: str, bottom: str, figure: Callable[[Measured], float]) -> list[float]:
        return [figure(t) / figure(b) for t, b in zip(rounds.load[top], rounds.load[bottom], strict=True)]

    _ratio_line(
        "streamed tokens/s, null engine / bare",
        ratios("null", "bare for null", lambda m: m.result.tokens_per_s),
        THROUGHPUT_TARGET,
    )
    _ratio_line(
        "streamed messages/s, null engine / bare", ratios("null", "bare for null", lambda m: m.result.messages_per_s)
    )
    _ratio_line("  the same with the mock engine", ratios("gateway", "bare", lambda m: m.result.tokens_per_s))


def _cpu_report(rounds: Rounds) -> None:
    report.section("server CPU per message (kernel accounting of each server process, all threads)")
    load = rounds.load
    per_message = {name: _median(runs, lambda m: m.server_us_per_message) for name, runs in load.items()}
    per_token = {name: _median(runs, lambda m: m.server_us_per_token) for name, runs in load.items()}
    busy = {name: _median(runs, lambda m: m.server_cpu_s / m.result.wall_s) for name, runs in load.items()}
    for name, runs in load.items():
        client = _median(runs, lambda m: m.client_cpu_s / m.result.messages * 1e6)
        report.line(
            name,
            f"{per_message[name]:.1f} us/msg, {per_token[name]:.2f} us/token "
            f"({busy[name]:.0%} of a core; client {client:.1f} us/msg)",
        )
    own = per_message["null"] - per_message["bare for null"]
    report.line(
        "gateway's own: null engine - bare",
        f"{own:.1f} us/msg (an upper bound: includes the null engine's steps)",
        report.target(own <= CPU_TARGET_US, f"<= {CPU_TARGET_US:.0f} us"),
    )
    report.line("gateway + mock engine - bare", f"{per_message['gateway'] - per_message['bare']:.1f} us/msg")
    # The gateway's process gets about one core (the interpreter's lock; grpc's threads add a little), so at
    # the target's rate it may spend its measured share of a core divided by that rate on each message.
    target_rate = THROUGHPUT_TARGET * _median(load["bare for null"], lambda m: m.result.messages_per_s)
    report.line(
        f"{THROUGHPUT_TARGET}x leaves the gateway's process",
        f"{busy['null'] / target_rate * 1e6:.1f} us/msg at {busy['null']:.0%} of a core; grpc.aio (bare) "
        f"{per_message['bare for null']:.1f} of it before any gateway work",
    )


def _ttft_report(rounds: Rounds, gateway_own: tuple[float, float]) -> None:
    report.section("time to first token (client-side, all rounds pooled)")
    _ttft_lines(1, rounds.single["gateway"], rounds.single["bare"])
    _ttft_lines(
        rounds.sizes.concurrency,
        [t for m in rounds.load["gateway"] for t in m.result.ttft_s],
        [t for m in rounds.load["bare"] for t in m.result.ttft_s],
    )
    total, count = gateway_own
    report.line(
        "  gateway-side, acceptance to first token", f"{report.ms(total / count)} mean over {count:.0f} streams"
    )


async def compare(rounds: int, sizes: Sizes, gateway: Server, null: Server, bare: Server) -> None:
    """The alternating rounds, the burst of ``sizes.burst`` streams, and their report."""
    metrics_port = int(re.findall(r"metrics on port (\d+)", gateway.log.read_text())[0])
    measured = Rounds(gateway, null, bare, sizes)
    try:
        await measured.run_rounds(rounds)
        before = server_ttft(metrics_port)
        await measured.one("gateway", sizes.concurrency, sizes.requests)
        after = server_ttft(metrics_port)
        _throughput_report(measured)
        _cpu_report(measured)
        _ttft_report(measured, (after[0] - before[0], after[1] - before[1]))
        report.section(f"{sizes.burst} concurrent streams (one burst, {MAX_TOKENS} tokens each)")
        for name in ("gateway", "bare"):
            chunks = None if name == "gateway" else measured.shape["gateway", sizes.concurrency]
            call = generate_call(measured.methods[name], chunks)
            _many_line(name, await run(call, concurrency=sizes.burst, requests=sizes.burst), sizes.burst)
    finally:
        await measured.close()


async def memory(directory: Path, messages: Path, streams: int) -> None:
    """RSS per open, paused stream: the gateway before its engine's first step ends, the bare server holding."""
    report.section(f"memory per open, paused stream ({streams} streams held open)")
    figures: dict[str, float] = {}
    starts: dict[str, Callable[[], Server]] = {
        # The first prefill step takes hours: every stream is accepted and open, none has a token yet.
        "gateway": lambda: start_gateway(directory / "gateway-paused.log", prefill_time_per_token_s=1000.0),
        "bare": lambda: start_bare(messages, directory / "bare-hold.log", hold=True),
    }
    for name, start in starts.items():
        server = start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                figures[name], _ = await open_stream_bytes(server, generate_method(channel), streams)
        finally:
            server.stop()
        report.line(name, f"{figures[name] / 1024:.1f} KiB/stream")
    report.line("gateway's extra over bare", f"{(figures['gateway'] - figures['bare']) / 1024:.1f} KiB/stream")


async def main(rounds: int, sizes: Sizes = FULL) -> None:
    """Start the servers, measure, print."""
    report.header("gateway ceiling: mock engine at zero step time vs a bare grpc.aio server")
    with tempfile.TemporaryDirectory(prefix="gateway-ceiling-") as temporary:
        directory = Path(temporary)
        messages = directory / "stream.bin"
        recorded = await record(directory)
        write_messages(messages, recorded)
        byte_sizes = [message.ByteSize() for message in recorded]
        report.line(
            "recorded gateway stream",
            f"{len(recorded)} messages, {sum(byte_sizes)} bytes, {statistics.median(byte_sizes):.0f} bytes median",
        )
        servers: list[Server] = []
        try:
            starts: list[Callable[[], Server]] = [
                lambda: start_gateway(directory / "gateway.log"),
                lambda: start_null(messages, directory / "null.log", "--step-s", str(NULL_STEP_S)),
                lambda: start_bare(messages, directory / "bare.log"),
            ]
            for start in starts:
                servers.append(start())
            await compare(rounds, sizes, *servers)
        finally:
            for server in servers:
                server.stop()
        await memory(directory, messages, sizes.open_streams)


def cli() -> None:
    """Entry point: ``python -m benchmarks.gateway_ceiling``."""
    parser = argparse.ArgumentParser(description="The gateway on a zero-cost engine against a bare gRPC server.")
    parser.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="small runs: checks the program, not the gateway")
    args = parser.parse_args()
    uvloop.run(main(args.rounds, QUICK if args.quick else FULL))


if __name__ == "__main__":
    cli()
