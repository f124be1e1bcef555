"""Hostile clients against the real command: what they can make the gateway hold is bounded.

Each test runs one attack for a few seconds against ``openengine-gateway --backend mock``
with tokens, over raw HTTP/2 (``raw_h2``) where grpc's own client would not send it, and
reads the process's resident memory (``/proc/PID/status``) during and after it: under the
attack's bound while it runs, and back near the baseline once it stops. A well-behaved client
on its own connection measures its latency idle and under the attack in the same test: it
never sees CANCELLED, and its latency stays within a generous ratio of the idle run (a shared,
noisy 2-core machine runs these).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import statistics
import struct
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from openengine_gateway import pb

from tests.ops.conftest import Figures
from tests.ops.raw_h2 import frame, many_calls, never_reading, rapid_reset, raw_call
from tests.ops.support import free_port
from tests.process import GatewayProcess, gateway_process

MIB = 1024 * 1024
ALICE = "alice-tok-1a2b3c"
ROUTER = "router-tok-0d1e2f"
LATENCY_RATIO = 30.0
"""How much slower a good client may get under an attack than idle (p90 of short Generates)."""
LATENCY_FLOOR_S = 0.5
"""Below this, a good client's p90 passes whatever the ratio (idle p90s of a few ms are noise)."""


def resident(pid: int) -> int:
    """The process's resident memory in bytes (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@contextlib.contextmanager
def peak_resident(pid: int) -> Iterator[list[int]]:
    """Sample ``resident(pid)`` every 20 ms while the block runs; the list holds the peak once it ends."""
    peak = [resident(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], resident(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


async def settled(pid: int, bound: int, within_s: float = 5.0) -> int:
    """The process's resident memory once it is under ``bound``, or after ``within_s`` (memory comes back
    as the calls' ends reach the server)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while (now := resident(pid)) >= bound and loop.time() < deadline:  # noqa: ASYNC110 (another process's memory)
        await asyncio.sleep(0.1)
    return now


def gzip_frame(message: Message) -> bytes:
    """``message`` as one gzip-compressed gRPC frame (the flag byte 1), what an attacker sends."""
    data = gzip.compress(message.SerializeToString(), compresslevel=9)
    return b"\x01" + struct.pack(">I", len(data)) + data


def _mib(*values: int) -> str:
    return " / ".join(str(value // MIB) for value in values)


def _as(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


@contextlib.asynccontextmanager
async def command(tmp_path: Path, *args: str, decode_s: float = 0.005) -> AsyncIterator[tuple[GatewayProcess, int]]:
    """The real command with the mock (``decode_s`` a token), Alice's inference token and the router's observer
    token; yields it and its port."""
    for scope, line in (("inference", f"alice {ALICE}"), ("observer", f"router {ROUTER}")):
        (tmp_path / scope).write_text(line + "\n")
        (tmp_path / scope).chmod(0o600)
    (tmp_path / "plugins.toml").write_text(f"[backends.mock]\ndecode_time_per_step_s = {decode_s}\n")
    argv = ("--backend", "mock", "--served-model-name", "mock", "--auth-token-file", "inference")
    argv += ("--observer-token-file", "observer", *args)
    async with gateway_process(*argv, cwd=tmp_path) as process:
        yield process, int(process.address.rsplit(":", 1)[1])


async def good_client(address: str, seconds: float) -> tuple[float, list[str]]:
    """Short Generates one after another for ``seconds`` on a connection of their own: their p90
    latency and every status code other than OK."""
    latencies: list[float] = []
    codes: list[str] = []
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.OpenEngineStub(channel)
        request = pb.GenerateRequest(model="mock", prompt="hi", stopping=pb.StoppingOptions(max_tokens=2))
        end = loop.time() + seconds
        while loop.time() < end:
            started = loop.time()
            try:
                async for _ in stub.Generate(request, metadata=(("authorization", f"Bearer {ALICE}"),), timeout=30):
                    pass
            except grpc.aio.AioRpcError as error:
                codes.append(error.code().name)
            latencies.append(loop.time() - started)
    return statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else latencies[0], codes


async def under_attack(address: str, attack: Callable[[], object], seconds: float) -> tuple[float, float, list[str]]:
    """The good client's p90 idle, then while ``attack`` runs in a thread: (idle, attacked, codes)."""
    idle, idle_codes = await good_client(address, 1.0)
    assert not idle_codes, idle_codes
    attacker = asyncio.create_task(asyncio.to_thread(attack))
    attacked, codes = await good_client(address, seconds)
    await attacker
    return idle, attacked, codes


def assert_unharmed(figures: Figures, attack: str, idle: float, attacked: float, codes: Sequence[str]) -> None:
    """No status but OK for the good client, and its p90 within the ratio (recorded in the figures)."""
    figures.record(
        f"hostile memory: {attack}, good client p90 idle / attacked", f"{idle * 1000:.1f} / {attacked * 1000:.1f} ms"
    )
    assert not codes, codes  # never CANCELLED, never refused
    assert attacked <= max(LATENCY_RATIO * idle, LATENCY_FLOOR_S), (idle, attacked)


async def test_refused_compressed_requests_leave_nothing_behind(tmp_path: Path, figures: Figures) -> None:
    """40 MiB inflated from 40 KiB of gzip, refused (an unknown model with a valid token, and no
    token at all): each refused request is freed when its call ends, not at the cycle collector's
    next pass, so eight in a row leave the process where it started."""
    inflated = pb.GenerateRequest(model="no-such-model", prompt="a" * (40 * MIB))
    body = gzip_frame(inflated)
    assert len(body) < 100 * 1024
    path = f"/{pb.SERVICE_NAME}/Generate"
    encoding = [(b"grpc-encoding", b"gzip")]
    async with command(tmp_path) as (process, port):
        pid = process.process.pid
        baseline = resident(pid)
        answers: list[tuple[bytes, bytes]] = []

        def attack() -> None:
            for headers in (_as(ALICE), []):
                for _ in range(4):
                    answers.append(raw_call(port, path, [*headers, *encoding], body, timeout_s=30)[b"grpc-status"])

        with peak_resident(pid) as peak:
            idle, attacked, codes = await under_attack(process.address, attack, 2.0)
        after = resident(pid)
        assert await process.stop() == 0
    assert answers == [b"5"] * 4 + [b"16"] * 4  # NOT_FOUND, then UNAUTHENTICATED
    figures.record("hostile memory: refused gzip requests, MiB baseline / peak / after", _mib(baseline, peak[0], after))
    assert peak[0] - baseline < 200 * MIB, (baseline // MIB, peak[0] // MIB)
    assert after - baseline < 100 * MIB, (baseline // MIB, after // MIB)
    assert_unharmed(figures, "refused gzip requests", idle, attacked, codes)


async def test_past_the_memory_budget_new_work_is_shed_and_the_metrics_say_so(tmp_path: Path) -> None:
    """A budget under what the process already holds: every new request is RESOURCE_EXHAUSTED with a
    retry hint, discovery still answers, and the metrics show the memory, the budget and each shed."""
    port = free_port()
    async with command(tmp_path, "--max-memory-mib", "32", "--metrics-port", str(port)) as (process, _):
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = pb.OpenEngineStub(channel)
            metadata = (("authorization", f"Bearer {ALICE}"),)
            request = pb.GenerateRequest(model="mock", prompt="hi", stopping=pb.StoppingOptions(max_tokens=2))
            with pytest.raises(grpc.aio.AioRpcError) as shed:
                async for _ in stub.Generate(request, metadata=metadata, timeout=10):
                    pass
            assert await stub.GetLoad(pb.GetLoadRequest(), metadata=metadata, timeout=10) is not None
        page = await asyncio.to_thread(scrape, port)
        assert await process.stop() == 0
    assert shed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "32 MiB memory budget (--max-memory-mib)" in (shed.value.details() or "")
    assert ("retry-after-ms", "1000") in tuple(shed.value.trailing_metadata() or ())
    assert "openengine_gateway_memory_shed_total 1.0" in page
    assert "openengine_gateway_memory_budget_bytes 3.3554432e+07" in page  # 32 MiB
    assert "openengine_gateway_resident_memory_bytes " in page


def scrape(port: int) -> str:
    """The metrics page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


WATCH = "/grpc.health.v1.Health/Watch"


def _watch(service: str) -> health_pb2.HealthCheckRequest:
    return health_pb2.HealthCheckRequest(service=service)


async def test_health_watches_are_bounded_per_connection_in_all_and_by_name(tmp_path: Path) -> None:
    """No token needed: 200 Watch streams on one connection hold 16 (the rest RESOURCE_EXHAUSTED), and
    a Watch whose service name is 20 MiB inflated (20 KiB of gzip) is INVALID_ARGUMENT and freed."""
    metrics = free_port()
    async with command(tmp_path, "--max-health-watches", "24", "--metrics-port", str(metrics)) as (process, port):
        pid = process.process.pid
        baseline = resident(pid)
        first, statuses = await asyncio.to_thread(many_calls, port, WATCH, frame(_watch("")), 200, settle_s=2.0)
        assert len(statuses) == 200 - 16 and set(statuses.values()) == {b"8"}, statuses
        second, more = await asyncio.to_thread(many_calls, port, WATCH, frame(_watch("")), 16, settle_s=2.0)
        assert len(more) == 8 and set(more.values()) == {b"8"}  # 24 in all
        assert "openengine_gateway_health_watches 24.0" in await asyncio.to_thread(scrape, metrics)
        huge = gzip_frame(_watch("s" * (20 * MIB)))
        with peak_resident(pid) as peak:
            answers = [raw_call(port, WATCH, [(b"grpc-encoding", b"gzip")], huge) for _ in range(6)]
        assert [a[b"grpc-status"] for a in answers] == [b"3"] * 6, answers[0]
        for sock in (first, second):
            sock.close()
        after = await settled(pid, baseline + 60 * MIB)
        assert await process.stop() == 0
    assert peak[0] - baseline < 150 * MIB, (baseline // MIB, peak[0] // MIB)
    assert after - baseline < 60 * MIB, (baseline // MIB, after // MIB)


async def test_inference_probes_are_admitted_like_requests_and_rate_limited(tmp_path: Path) -> None:
    """An observer's probes hold an in-flight slot each (refused while Alice holds both), and past a
    burst of 5 get RESOURCE_EXHAUSTED with the wait until the next."""
    async with command(tmp_path, "--max-in-flight", "2") as (process, _):
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = pb.OpenEngineStub(channel)
            probe = pb.HealthRequest(include_inference_probe=True)
            router = (("authorization", f"Bearer {ROUTER}"),)
            long = pb.GenerateRequest(model="mock", prompt="hi", stopping=pb.StoppingOptions(max_tokens=1000))
            streams = [stub.Generate(long, metadata=(("authorization", f"Bearer {ALICE}"),)) for _ in range(2)]
            for stream in streams:
                await anext(aiter(stream))
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await stub.Health(probe, metadata=router, timeout=10)
            for stream in streams:
                stream.cancel()
            await asyncio.sleep(1.0)  # the cancelled streams' slots come back (and the probe bucket refills)
            answers = []
            for _ in range(8):
                try:
                    answers.append(pb.HealthState.Name((await stub.Health(probe, metadata=router, timeout=10)).state))
                except grpc.aio.AioRpcError as error:
                    answers.append(error.code().name)
                    hint = dict(error.trailing_metadata() or ())
        assert await process.stop() == 0
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 2 concurrent requests" in (full.value.details() or "")
    assert answers[:4] == ["HEALTH_STATE_READY"] * 4 and answers[-2:] == ["RESOURCE_EXHAUSTED"] * 2, answers
    assert 0 < int(hint["retry-after-ms"]) <= 1000


def _greedy_reader_request(n: int) -> pb.GenerateRequest:
    """1 KiB asking for the most a client can: 8 sequences of 1,024 tokens, every candidate's logprob."""
    return pb.GenerateRequest(
        request_id=f"never-reads-{n}",
        model="mock",
        prompt="hi",
        sampling=pb.SamplingParams(num_sequences=8, temperature=1.0),
        stopping=pb.StoppingOptions(max_tokens=1024, ignore_eos=True),
        response=pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(all=pb.AllCandidates())),
    )


async def test_never_reading_clients_hold_a_bounded_amount_that_comes_back(tmp_path: Path, figures: Figures) -> None:
    """Four requests that are never read, twice: they end OVERLOADED at their caller's unread bound (262,144
    entries, about 35 MiB; their engine work aborted) instead of pinning what they asked for (about 270 MiB
    each), and what the first round held is reused by the second rather than added to it."""
    path = f"/{pb.SERVICE_NAME}/Generate"
    async with command(tmp_path, "--max-unread-per-caller", "262144", decode_s=0.0) as (process, port):
        pid = process.process.pid
        baseline = resident(pid)
        rounds: list[tuple[int, float, float, list[str]]] = []

        def attack() -> None:
            sockets = [never_reading(port, path, frame(_greedy_reader_request(n)), _as(ALICE)) for n in range(4)]
            time.sleep(3.0)
            for sock in sockets:
                sock.close()

        with peak_resident(pid) as peak:
            for _ in range(2):
                idle, attacked, codes = await under_attack(process.address, attack, 3.0)
                rounds.append((await settled(pid, baseline + 60 * MIB), idle, attacked, codes))
        assert await process.stop() == 0
    (first, *_), (second, idle, attacked, codes) = rounds
    figures.record(
        "hostile memory: never-reading clients, MiB baseline / peak / after 1 / after 2",
        _mib(baseline, peak[0], first, second),
    )
    assert peak[0] - baseline < 100 * MIB, (baseline // MIB, peak[0] // MIB)
    assert second - first < 40 * MIB, (baseline // MIB, first // MIB, second // MIB)
    assert_unharmed(figures, "never-reading clients", idle, attacked, codes)


async def test_costly_guided_patterns_are_refused_before_work_and_stall_no_one(
    tmp_path: Path, figures: Figures
) -> None:
    """The mock's regex guides: a nested repetition is refused by its cost bound before any match runs, and
    a long literal (whose first match takes ~20 ms, uninterrupted) is checked off the event loop."""
    path = f"/{pb.SERVICE_NAME}/Generate"
    patterns = ("(a|aa){30}((a|aa)*)*c", "x" * 512)
    answers: list[bytes] = []

    def attack() -> None:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for pattern in patterns:
                request = pb.GenerateRequest(
                    model="mock",
                    prompt="hi",
                    sampling=pb.SamplingParams(num_sequences=8),
                    stopping=pb.StoppingOptions(max_tokens=1),
                    guided=pb.GuidedDecoding(regex=pattern),
                )
                answer = raw_call(port, path, _as(ALICE), frame(request), timeout_s=10)
                answers.append((answer.get(b"grpc-status", b""), answer.get(b"grpc-message", b"")))

    async with command(tmp_path) as (process, port):
        idle, attacked, codes = await under_attack(process.address, attack, 2.5)
        assert await process.stop() == 0
    nested, literal = answers[::2], answers[1::2]
    assert {status for status, _ in nested} == {b"3"}  # INVALID_ARGUMENT, every time
    assert b"repeats a repetition without bound" in nested[0][1], nested[0]
    assert {status for status, _ in literal} == {b"0"}
    assert_unharmed(figures, "costly guided patterns", idle, attacked, codes)


async def test_a_rapid_reset_flood_cancels_no_good_client(tmp_path: Path, figures: Figures) -> None:
    """HEADERS and RST_STREAM, again and again, on one connection (CVE-2023-44487), with the streams of one
    connection bounded at 256: grpc refuses the flood's streams past it without handing them to Python, and a
    good client on another connection never sees CANCELLED and keeps its latency within the ratio (p90 0.64 s
    of a 9 ms idle one without the bound, 0.05 s with it, at about 14,000 resets a second here)."""
    path = f"/{pb.SERVICE_NAME}/Generate"
    body = frame(pb.GenerateRequest(model="mock", prompt="hi", stopping=pb.StoppingOptions(max_tokens=2)))
    opened: list[int] = []
    async with command(tmp_path, "--max-streams-per-connection", "256") as (process, port):
        idle, attacked, codes = await under_attack(
            process.address, lambda: opened.append(rapid_reset(port, path, body, 4.0, _as(ALICE))), 4.0
        )
        assert await process.stop() == 0
    assert_unharmed(figures, "rapid reset", idle, attacked, codes)
