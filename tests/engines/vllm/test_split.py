"""A split and a mirror of real vLLM beside the mock engine, for this module only.

The tiny Llama and the mock read token ids differently (different tokenizers), so the split withdraws
token-id input and the mirror compares their outputs as text. The engine is a second one beside the
session's (a split needs both engines behind one gateway), started with the session's options.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("vllm")

from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.client import Completion, OpenEngineClient, StatusError, text_request
from openengine_gateway.config import AnalysisLimits, AnalysisSection, MirrorSection, SplitSection
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL

from .conftest import engine_options

pytestmark = pytest.mark.vllm

SPLIT = "both"
PROMPTS = ["the quick brown fox jumps over", "once upon a time", "hello world"]


@pytest.fixture(scope="module")
async def served(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    """The tiny Llama as ``tiny`` and a mock as ``mock``, split as ``both``; ``tiny`` mirrored to ``mock``."""
    from openengine_backends.vllm import VllmBackend, VllmSettings

    vllm = VllmBackend(VllmSettings(model=str(tiny_model), **engine_options(kv_events_config=None)))
    mock = MockBackend(MockSettings())
    async with serve_backends(
        [(MODEL, vllm), ("mock", mock)],
        splits=[SplitSection(name=SPLIT, engines={MODEL: 1, "mock": 1})],
        mirrors=[MirrorSection(name=MODEL, shadow="mock")],
    ) as running:
        yield running


@pytest.fixture
async def client(served: RunningGateway) -> AsyncIterator[OpenEngineClient]:
    async with await OpenEngineClient.connect(served.address) as connected:
        yield connected


def greedy(model: str, prompt: str | list[int], **options: Any) -> pb.GenerateRequest:
    return text_request(prompt, model=model, request_id=uuid.uuid4().hex, temperature=0.0, **options)


async def test_the_split_withdraws_token_ids_because_the_tokenizers_differ(client: OpenEngineClient) -> None:
    info = await client.model_info(SPLIT)
    alone = {name: await client.model_info(name) for name in (MODEL, "mock")}
    ids = [1, 40, 41]  # within both vocabularies
    by_name = [await client.generate(greedy(name, ids, max_tokens=2)) for name in (MODEL, "mock")]
    with pytest.raises(StatusError) as refused:
        await client.generate(greedy(SPLIT, ids, max_tokens=2))
    text = await client.generate(greedy(SPLIT, PROMPTS[0], max_tokens=2))
    assert all(engine.supports_token_ids_input for engine in alone.values()) and not info.supports_token_ids_input
    modes = info.generation.output_logprobs.candidate_selection_modes
    assert pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS not in modes
    assert all(len(completion.outputs[0].tokens) == 2 for completion in by_name)  # each engine takes them alone
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tokenizers differ" in refused.value.details and "token_ids" in refused.value.details
    assert len(text.outputs[0].tokens) == 2


async def test_a_request_at_the_split_limits_is_valid_on_each_engine(client: OpenEngineClient) -> None:
    info = await client.model_info(SPLIT)
    alone = {name: await client.model_info(name) for name in (MODEL, "mock")}
    for limit in ("max_context_length", "max_output_tokens"):  # the smallest reported (vLLM has no output limit)
        reported = [getattr(engine, limit) for engine in alone.values() if engine.HasField(limit)]
        assert getattr(info, limit) == min(reported), limit
    top_n, sequences = info.generation.output_logprobs.max_top_n, info.generation.max_num_sequences
    assert top_n == min(engine.generation.output_logprobs.max_top_n for engine in alone.values())

    def request(model: str, top_n: int) -> pb.GenerateRequest:
        at = greedy(model, PROMPTS[0], max_tokens=4, num_sequences=sequences, return_output_logprobs=True)
        at.sampling.temperature, at.sampling.seed = 1.0, 7  # vLLM samples several sequences only above 0
        at.response.output_candidates.top_n = top_n
        return at

    for model in (MODEL, "mock", SPLIT):
        completion = await client.generate(request(model, top_n))
        assert len(completion.outputs) == sequences and len(completion.outputs[0].tokens[0].candidates) == top_n
    wider = max(alone, key=lambda name: alone[name].generation.output_logprobs.max_top_n)
    assert alone[wider].generation.output_logprobs.max_top_n > top_n, "the engines share one top_n limit"
    assert (await client.generate(request(wider, top_n + 1))).outputs
    with pytest.raises(StatusError) as refused:
        await client.generate(request(SPLIT, top_n + 1))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_mirror_compares_vllm_and_the_mock_as_text(served: RunningGateway, client: OpenEngineClient) -> None:
    shadow = [await client.generate(greedy("mock", prompt, max_tokens=8)) for prompt in PROMPTS]
    before = served.gateway.agreement.pairs.get((MODEL, "mock"))
    compared = before.copies["compared"] if before else 0
    primary = [await client.generate(greedy(MODEL, prompt, max_tokens=8)) for prompt in PROMPTS]
    for _ in range(200):
        stats = served.gateway.agreement.pairs.get((MODEL, "mock"))
        if stats is not None and stats.copies["compared"] == compared + len(PROMPTS):
            break
        await asyncio.sleep(0.01)
    assert stats is not None and stats.copies["compared"] == compared + len(PROMPTS)
    identical = sum(_text(ours) == _text(theirs) for ours, theirs in zip(primary, shadow, strict=True))
    assert stats.identical == {"tokens": 0, "text": identical}
    assert stats.diverged == {"tokens": 0, "text": len(PROMPTS) - identical}


def _text(completion: Completion) -> str:
    return completion.outputs[0].text


async def test_a_canary_of_the_mock_against_vllm_is_rolled_back_on_greedy_agreement(
    served: RunningGateway, client: OpenEngineClient
) -> None:
    """vLLM the baseline, the mock the candidate: the split mirrored to the mock, whose greedy text never matches
    the tiny Llama's, so agreement fails at the first step; the module's routes come back after."""
    gateway = served.gateway
    before = gateway.routes
    analysis = AnalysisSection(
        baseline=MODEL,
        candidate="mock",
        steps=[50, 100],
        step_s=0.1,
        min_samples=5,
        limits=AnalysisLimits(agreement=0.9),
    )
    gateway.reroute(
        [SplitSection(name=SPLIT, engines={MODEL: 1, "mock": 1}, analysis=analysis)],
        [MirrorSection(name=SPLIT, shadow="mock")],
    )
    try:
        canary = gateway.canaries.running[SPLIT]
        while not canary.done:
            await asyncio.gather(*(client.generate(greedy(SPLIT, prompt, max_tokens=4)) for prompt in PROMPTS))
        route = gateway.routes.get(SPLIT)
        assert route is not None and dict(zip([e.served_name for e in route.engines], route.weights, strict=True)) == {
            MODEL: 100,
            "mock": 0,
        }
    finally:
        gateway.reroute(before.splits, before.mirrors)
    assert canary.state == "rolled back", canary.evidence
    assert canary.evidence[-1].startswith("rolled back at step 1 (mock 50%): greedy agreement: 0.0% of ")
    assert gateway.canaries.running == {}
