"""NVIDIA Dynamo 1.6.1's own worker and frontend in front of the real gateway command, on the mock and on vLLM.

Nothing on the Dynamo side is written here: ``python -m dynamo.trtllm.sidecar`` (native code from
``ai-dynamo-runtime``) registers the gateway as a Dynamo worker, and requests reach it through
Dynamo's own request plane (``drive.py``, the runtime's Python client) or its OpenAI frontend
(``python -m dynamo.frontend``). The sidecar speaks upstream's later layout
(``openengine.v1.Inference``/``Control``): ``GetModelInfo`` for the context window, ``Generate``,
and ``Abort`` when Dynamo stops a request. What comes back is checked against the gateway's own
answer to the same token ids. The commands are the ones docs/dynamo.md gives for running it by hand.

About 40 s for the mock and 90 s for vLLM on an idle 2-core machine (vLLM's start is most of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openengine_gateway.client import OpenEngineClient, text_request

from tests.dynamo.mock_tokenizer import write_model_directory
from tests.dynamo.processes import (
    Deployment,
    http_json,
    require_dynamo,
    tokens_and_usage,
    wait_until,
)
from tests.engines.streams import free_port
from tests.ops.test_metrics import P, Scrape, scrape
from tests.process import GatewayProcess, gateway_process

pytestmark = pytest.mark.dynamo

PROMPT = "the quick brown fox"
MAX_TOKENS = 12
STOP_AFTER = 3
"""Responses read before Dynamo is told to stop generating."""


@dataclass
class Worker:
    """A gateway on one engine, registered with Dynamo by the sidecar."""

    deployment: Deployment
    gateway: GatewayProcess
    metrics_port: int
    card: dict[str, Any]
    """The model card the sidecar registered."""
    prompt: list[int]
    """``PROMPT``'s token ids, as Dynamo's frontend makes them with the model directory's tokenizer."""
    config_positions: int
    """``max_position_embeddings`` of the model directory's ``config.json``: not the served context."""
    long: dict[str, Any]
    """Stop conditions of a request that runs for tens of seconds unless stopped."""

    @property
    def model(self) -> str:
        return str(self.card["display_name"])


def mock_gateway(directory: Path, metrics_port: int) -> contextlib.AbstractAsyncContextManager[GatewayProcess]:
    """The mock, its context (1536) unlike its directory's ``config.json`` (4096), decoding at 50 tokens/s."""
    write_model_directory(directory / "mock-model", max_positions=4096)
    args = ("--backend", "mock", "--max-context-length", "1536", "--decode-time-per-step-s", "0.02")
    return gateway_process(*args, "--metrics-port", str(metrics_port), cwd=directory)


def vllm_gateway(directory: Path, metrics_port: int) -> contextlib.AbstractAsyncContextManager[GatewayProcess]:
    """vLLM (CPU) on the tiny Llama, served as ``tiny-llama`` with the engine suite's options (context 8192;
    its ``config.json`` says 1024)."""
    pytest.importorskip("vllm")
    from openengine_backends.vllm.tiny_model import build

    from tests.engines.vllm.conftest import engine_options
    from tests.engines.vllm.test_frontends import toml_table

    model = build(directory / "tiny-llama")
    (directory / "plugins.toml").write_text(
        '[plugins]\nallow = ["vllm"]\n\n[[engines]]\nbackend = "vllm"\nserved_model_name = "tiny-llama"\n\n'
        + toml_table("engines.options", engine_options(model=str(model)))
    )
    args = ("--config", "plugins.toml", "--metrics-port", str(metrics_port))
    return gateway_process(*args, cwd=directory, startup_s=300)


def prompt_ids(model_directory: Path) -> list[int]:
    """``PROMPT`` tokenized by the directory's ``tokenizer.json`` as Dynamo's frontend tokenizes a completion's
    prompt: without the special tokens the tokenizer's post-processor adds (the tiny Llama's BOS)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_directory / "tokenizer.json"))
    return list(tokenizer.encode(PROMPT, add_special_tokens=False).ids)


@pytest.fixture(scope="module", params=["mock", pytest.param("vllm", marks=pytest.mark.vllm)])
async def worker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Worker]:
    """The real gateway command on the engine, and Dynamo's sidecar registering it, until the module ends."""
    require_dynamo()
    engine: str = request.param
    directory = tmp_path_factory.mktemp(f"dynamo-{engine}")
    metrics_port = free_port()
    starting = (mock_gateway if engine == "mock" else vllm_gateway)(directory, metrics_port)
    model = directory / ("mock-model" if engine == "mock" else "tiny-llama")
    long = {"max_tokens": 1024 if engine == "mock" else 7936}  # 20 s at the mock's pace; vLLM's context - 256
    deployment = Deployment(directory)
    async with starting as gateway:
        async with deployment.sidecar(gateway.address, model.name) as card:
            positions = int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
            yield Worker(deployment, gateway, metrics_port, card, prompt_ids(model), positions, long)
        assert await gateway.stop(within_s=90) == 0, gateway.log.read_text()[-4000:]


def preprocessed(worker: Worker, **stop_conditions: Any) -> dict[str, Any]:
    """A greedy ``PreprocessedRequest`` of the prompt's ids, as Dynamo's frontend sends a worker."""
    return {
        "model": worker.model,
        "token_ids": worker.prompt,
        "stop_conditions": {"ignore_eos": True, **stop_conditions},
        "sampling_options": {"temperature": 0.0},
        "output_options": {},
        "eos_token_ids": [],
        "annotations": [],
    }


async def direct(worker: Worker, prompt: list[int], **options: Any) -> Any:
    """The gateway's own greedy answer to ``prompt``, asked over its seed layout with this project's client."""
    async with await OpenEngineClient.connect(worker.gateway.address) as client:
        return await client.generate(text_request(prompt, model=worker.model, temperature=0.0, **options))


async def test_a_streamed_generate_through_dynamo_has_the_engines_tokens_and_usage(worker: Worker) -> None:
    responses = await worker.deployment.drive(preprocessed(worker, max_tokens=MAX_TOKENS))
    tokens, finish_reason, usage = tokens_and_usage(responses)
    expected = await direct(worker, worker.prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert tokens == expected.outputs[0].token_ids
    assert len(responses) > 1, "streamed, not one answer at the end"
    assert finish_reason == "length"
    assert usage["prompt_tokens"] == len(worker.prompt) == expected.usage.prompt_tokens
    assert usage["completion_tokens"] == MAX_TOKENS == expected.usage.completion_tokens


async def test_the_context_length_dynamo_registers_comes_from_get_model_info(worker: Worker) -> None:
    async with await OpenEngineClient.connect(worker.gateway.address) as client:
        served = (await client.model_info(worker.model)).max_context_length
    assert worker.card["context_length"] == served != worker.config_positions


OUTCOMES = ("finished", "aborted", "cancelled", "failed")


def outcomes(page: Scrape) -> dict[str, float]:
    """Ended Generate streams by outcome."""
    return {o: page.get(f"{P}_request_outcomes_total", kind="generate", outcome=o) or 0.0 for o in OUTCOMES}


async def test_dynamo_stopping_a_request_aborts_it_in_the_gateway(worker: Worker) -> None:
    before = outcomes(await scrape(worker.metrics_port))
    aborts = (await scrape(worker.metrics_port)).get(f"{P}_requests_total", rpc="Abort", code="OK") or 0.0
    responses = await worker.deployment.drive(preprocessed(worker, **worker.long), stop_after=STOP_AFTER)
    tokens, finish_reason, _ = tokens_and_usage(responses)
    assert STOP_AFTER <= len(tokens) < worker.long["max_tokens"] and finish_reason != "length"

    async def settled() -> Scrape | None:
        page = await scrape(worker.metrics_port)
        return page if page(f"{P}_in_flight_requests") == 0 else None

    page = await wait_until(settled, 60, "the gateway ends the request", worker.gateway.log)
    after = outcomes(page)
    ended = {o: after[o] - before[o] for o in OUTCOMES}
    assert ended["aborted"] + ended["cancelled"] == 1 and ended["finished"] == ended["failed"] == 0, ended
    # The sidecar also sends Control/Abort for the request (the gateway answers it whether or not the
    # cancelled stream got there first).
    assert (page.get(f"{P}_requests_total", rpc="Abort", code="OK") or 0.0) > aborts


async def test_an_openai_completion_through_dynamos_frontend(worker: Worker) -> None:
    async with worker.deployment.frontend(free_port(), worker.model) as url:
        body = {"model": worker.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0}
        answer = await asyncio.to_thread(http_json, f"{url}/v1/completions", body)
    expected = await direct(worker, worker.prompt, max_tokens=8)
    assert answer["choices"][0]["text"] == expected.outputs[0].text
    assert answer["usage"]["prompt_tokens"] == len(worker.prompt) == expected.usage.prompt_tokens
    assert answer["usage"]["completion_tokens"] == expected.usage.completion_tokens
