"""The gateway on vLLM against vLLM's own OpenAI server and against ``AsyncLLM`` in process, in one run.

    python -m benchmarks.vllm_overhead [--rounds 5]

One model (the tiny Llama, built offline), one engine configuration, three ways to reach it: the gateway
(``openengine-gateway --backend vllm``, a child process), vLLM's OpenAI-compatible server
(``python -m vllm.entrypoints.openai.api_server``, a child process, streaming completions over HTTP), and
``AsyncLLM`` called in this process (the ceiling: no server at all). Every request is the same: a fixed
prompt, greedy, ``max_tokens`` tokens with ``ignore_eos``. The client (this process) runs the same closed
loop against each, alternating the order round by round.

Targets: output throughput at least vLLM's own server's and at least 0.97 of ``AsyncLLM`` in process;
time to first token no higher than vLLM's server's at p50 and p99.
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
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import uvloop
from openengine_gateway.client import text_request

from . import report
from .processes import Server, python
from .workload import Generate, RunResult, StreamCall, generate_method, percentile, run

SERVED = "tiny"
MAX_TOKENS = 64
LOAD_CONCURRENCY = 16
LOAD_REQUESTS = 128
SINGLE_REQUESTS = 48
"""Concurrency-1 requests per target and round, interleaved across the targets request by request."""
REWARM_REQUESTS = 2
"""Untimed requests before each load run: its engine idled while the others ran, and on every target the
first request after idling is the slowest of its run, which the TTFT p99 would otherwise measure."""
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
"""The engine arguments all three share (as in tests/engines/vllm)."""

THROUGHPUT_VS_SERVER = 1.0
THROUGHPUT_VS_IN_PROCESS = 0.97
_RUNS = itertools.count()


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


def start_gateway(model: Path, log: Path) -> Server:
    """``openengine-gateway --backend vllm`` on the model, in a child process."""
    argv = python("-m", "openengine_gateway.cli", "--backend", "vllm", "--model", str(model))
    argv += ["--served-model-name", SERVED, "--port", "0", "--drain-timeout", "0", "--log-level", "WARNING"]
    return Server("gateway", argv + _flags(booleans_as_words=True), log=log, ready="openengine-gateway serving")


def start_openai_server(model: Path, log: Path) -> Server:
    """vLLM's OpenAI-compatible server on the model, in a child process."""
    argv = python("-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", SERVED)
    argv += ["--host", "127.0.0.1", "--port", str(_free_port()), "--disable-uvicorn-access-log"]
    return Server("vllm server", argv + _flags(booleans_as_words=False), log=log, ready="Starting vLLM server on")


async def wait_healthy(session: aiohttp.ClientSession, address: str, timeout_s: float = 120.0) -> None:
    """Until vLLM's server answers ``/health`` (it prints its address before the app has started)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                async with session.get(f"http://{address}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)


def gateway_call(generate: Generate) -> StreamCall:
    """Generate over gRPC; yields each message's token count."""
    run_id = next(_RUNS)

    async def call(number: int) -> AsyncIterator[int]:
        request = text_request(
            PROMPTS[number % len(PROMPTS)],
            model=SERVED,
            request_id=f"g{run_id}-{number}",
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            ignore_eos=True,
        )
        async for response in generate(request):
            yield len(response.token.tokens)

    return call


def openai_call(session: aiohttp.ClientSession, address: str) -> StreamCall:
    """A streamed ``/v1/completions`` call; yields each chunk's new tokens (from its running usage)."""
    url = f"http://{address}/v1/completions"

    async def call(number: int) -> AsyncIterator[int]:
        body = {
            "model": SERVED,
            "prompt": PROMPTS[number % len(PROMPTS)],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        async with session.post(url, json=body) as response:
            response.raise_for_status()
            seen = 0
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue  # blank separators and the closing "data: [DONE]"
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    yield usage["completion_tokens"] - seen
                    seen = usage["completion_tokens"]

    return call


def in_process_call(engine: Any, params: Any) -> StreamCall:
    """``AsyncLLM.generate`` with delta outputs; yields each output's new tokens."""
    run_id = next(_RUNS)

    async def call(number: int) -> AsyncIterator[int]:
        async for output in engine.generate(PROMPTS[number % len(PROMPTS)], params, f"p{run_id}-{number}"):
            yield len(output.outputs[0].token_ids)

    return call


async def start_in_process(model: Path) -> tuple[Any, Any]:
    """``AsyncLLM`` on the model in this process (started in a thread: it blocks), and the sampling params."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    # The engine is never bound to a name in this frame: an exception that vLLM keeps from one of the
    # imports above holds the frame, and with it its locals, until the interpreter exits.
    return await asyncio.to_thread(AsyncLLM.from_engine_args, AsyncEngineArgs(model=str(model), **ENGINE)), params


def _verdict_ratio(value: float, at_least: float) -> str:
    return report.target(value >= at_least, f">= {at_least}x")


@dataclass
class Target:
    """One way to reach the engine: its calls, and the process serving them (None: this one)."""

    call: Callable[[], StreamCall]
    server: Server | None = None


@dataclass
class Measured:
    """One run: the client's view, and the CPU time of the serving process and of this one."""

    result: RunResult
    frontend_cpu_s: float
    client_cpu_s: float


async def measure_one(target: Target, *, concurrency: int, requests: int) -> Measured:
    """Run the workload once against ``target``, charging CPU time to its process and to this one."""
    server_start = target.server.cpu_s() if target.server is not None else 0.0
    client_start = time.process_time()
    result = await run(target.call(), concurrency=concurrency, requests=requests)
    client = time.process_time() - client_start
    frontend = target.server.cpu_s() - server_start if target.server is not None else client
    return Measured(result, frontend, client)


async def interleaved_singles(targets: dict[str, Target], requests: int) -> dict[str, RunResult]:
    """``requests`` requests at concurrency 1 to each target, one target after the other request by request
    (the order rotating), so a slow moment of the machine falls on all of them alike."""
    names = list(targets)
    results = {name: RunResult() for name in names}
    for number in range(requests):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            single = await run(targets[name].call(), concurrency=1, requests=1)
            results[name].ttft_s += single.ttft_s
            results[name].errors += single.errors
    return results


@dataclass
class Results:
    """Every round's runs, by target: the interleaved concurrency-1 requests and the load runs."""

    single: dict[str, list[RunResult]]
    load: dict[str, list[Measured]]


async def measure(rounds: int, targets: dict[str, Target]) -> Results:
    """Warm-up, then ``rounds`` rounds: concurrency-1 requests interleaved across the targets, then a load
    run on each target in turn, in the reverse order of the round before."""
    names: Sequence[str] = list(targets)
    results = Results({name: [] for name in names}, {name: [] for name in names})
    for name in names:
        await measure_one(targets[name], concurrency=LOAD_CONCURRENCY, requests=LOAD_CONCURRENCY)
    for number in range(rounds):
        for name, single in (await interleaved_singles(targets, SINGLE_REQUESTS)).items():
            results.single[name].append(single)
        for name in names if number % 2 == 0 else list(reversed(names)):
            target = targets[name]
            await run(target.call(), concurrency=1, requests=REWARM_REQUESTS)
            results.load[name].append(await measure_one(target, concurrency=LOAD_CONCURRENCY, requests=LOAD_REQUESTS))
    return results


def _print(results: Results) -> None:
    load = results.load
    rounds = len(load["gateway"])
    report.section(f"output throughput: {rounds} alternating rounds, {LOAD_CONCURRENCY} streams x {MAX_TOKENS} tokens")
    for name, runs in load.items():
        tokens = statistics.median(m.result.tokens_per_s for m in runs)
        errors = sum(len(m.result.errors) for m in runs)
        report.line(name, f"{tokens:,.1f} tokens/s, {errors} errors")

    def ratio(top: str, bottom: str, at_least: float | None = None) -> None:
        pairs = zip(load[top], load[bottom], strict=True)
        values = [t.result.tokens_per_s / b.result.tokens_per_s for t, b in pairs]
        median = statistics.median(values)
        verdict = _verdict_ratio(median, at_least) if at_least is not None else ""
        report.line(f"{top} / {bottom}", f"{median:.3f}x (rounds {min(values):.3f}..{max(values):.3f})", verdict)

    ratio("gateway", "vllm server", THROUGHPUT_VS_SERVER)
    ratio("gateway", "AsyncLLM in process", THROUGHPUT_VS_IN_PROCESS)
    # No target: what any out-of-process frontend reaches here, vLLM's own server included.
    ratio("vllm server", "AsyncLLM in process")
    report.section("frontend CPU per output token at load (kernel accounting; engine core and worker excluded)")
    for name, runs in load.items():
        frontend = statistics.median(m.frontend_cpu_s / m.result.tokens * 1e6 for m in runs)
        client = statistics.median(m.client_cpu_s / m.result.tokens * 1e6 for m in runs)
        where = "this process: AsyncLLM and the client" if name == "AsyncLLM in process" else f"client {client:.1f} us"
        report.line(name, f"{frontend:.1f} us/token ({where})")
    report.section("time to first token (client-side, all rounds pooled)")
    pooled_by_concurrency = {
        1: {name: [t for r in runs for t in r.ttft_s] for name, runs in results.single.items()},
        LOAD_CONCURRENCY: {name: [t for m in runs for t in m.result.ttft_s] for name, runs in load.items()},
    }
    for concurrency, pooled in pooled_by_concurrency.items():
        for q in (50, 99):
            figures = {name: percentile(values, q) for name, values in pooled.items()}
            gateway, server = figures["gateway"], figures["vllm server"]
            report.line(
                f"TTFT p{q} at concurrency {concurrency}",
                ", ".join(f"{name} {report.ms(value)}" for name, value in figures.items()),
                report.target(gateway <= server, "gateway <= vllm server"),
            )


async def main(rounds: int) -> None:
    """Build the model, start the three, measure, print."""
    from openengine_backends.vllm.tiny_model import build

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    report.header("vLLM overhead: the gateway vs vLLM's OpenAI server vs AsyncLLM in process", ("grpcio", "vllm-cpu"))
    with tempfile.TemporaryDirectory(prefix="vllm-overhead-") as temporary:
        directory = Path(temporary)
        model = build(directory / "tiny-llama")
        servers: list[Server] = []
        engine: Any = None
        try:
            servers.append(start_gateway(model, directory / "gateway.log"))
            servers.append(start_openai_server(model, directory / "vllm-server.log"))
            engine, params = await start_in_process(model)
            gateway, server = servers
            async with (
                grpc.aio.insecure_channel(gateway.address) as channel,
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            ):
                generate = generate_method(channel)
                await wait_healthy(session, server.address)
                results = await measure(
                    rounds,
                    {
                        "gateway": Target(lambda: gateway_call(generate), gateway),
                        "vllm server": Target(lambda: openai_call(session, server.address), server),
                        "AsyncLLM in process": Target(lambda: in_process_call(engine, params)),
                    },
                )
            _print(results)
        finally:
            if engine is not None:
                engine.shutdown()
                # Its __del__ shuts down again: let it run now, not at interpreter exit, where vLLM's
                # module globals are already gone (a TypeError printed after every run).
                engine = None
                gc.collect()
            for each in servers:
                each.stop()


def cli() -> None:
    """Entry point: ``python -m benchmarks.vllm_overhead``."""
    parser = argparse.ArgumentParser(description="The gateway on vLLM against vLLM's own server and AsyncLLM.")
    parser.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds (default 5)")
    uvloop.run(main(parser.parse_args().rounds))


if __name__ == "__main__":
    cli()
