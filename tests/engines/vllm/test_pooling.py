"""Embed and Score on vLLM's pooling runner (a second, embedding engine for this module only)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")

import torch
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.responses import collect

from .conftest import CONTEXT, engine_options
from .reference import TOLERANCE, Reference

pytestmark = pytest.mark.vllm

EMBEDDER = "tiny-embed"
TEXTS = ("the quick brown fox", "lazy dog", "the quick brown fox")


@pytest.fixture(scope="module")
async def embedder(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    """The tiny Llama as an embedding model (``--runner pooling --convert embed``)."""
    from openengine_backends.vllm import VllmBackend, VllmSettings

    options = engine_options(runner="pooling", convert="embed", kv_events_config=None)
    backend = VllmBackend(VllmSettings(model=str(tiny_model), **options))
    async with serve_backends([(EMBEDDER, backend)]) as running:
        yield running


@torch.no_grad()
def hidden_states(reference: Reference, text: str) -> torch.Tensor:
    """The model's final hidden states (after the last norm) for every token of ``text``."""
    ids = torch.tensor([reference.encode(text)])
    return reference.model.model(ids).last_hidden_state[0]


def context(request_id: str) -> pb.TaskRequestContext:
    return pb.TaskRequestContext(request_id=request_id, model=EMBEDDER)


def inputs(*texts: str) -> list[pb.TaskInput]:
    return [pb.TaskInput(item_id=f"i{n}", text=text) for n, text in enumerate(texts)]


async def test_capabilities_of_an_embedding_engine(embedder: RunningGateway) -> None:
    info = await embedder.stub.GetModelInfo(pb.GetModelInfoRequest(model=EMBEDDER))
    assert info.tasks.embed.supported and info.tasks.embed.dimension == 128
    assert list(info.tasks.embed.granularities) == [
        pb.TASK_OUTPUT_GRANULARITY_SEQUENCE,
        pb.TASK_OUTPUT_GRANULARITY_TOKEN,
    ]
    assert info.tasks.score.supported and info.tasks.score.higher_is_better
    assert not info.HasField("generation") and not info.tasks.HasField("classify")


async def test_sequence_embeddings_equal_the_normalized_last_hidden_state(
    embedder: RunningGateway, reference: Reference
) -> None:
    response = await embedder.stub.Embed(pb.EmbedRequest(context=context("embed"), inputs=inputs(*TEXTS)))
    assert [o.input_index for o in response.outputs] == [0, 1, 2]
    for output, text in zip(response.outputs, TEXTS, strict=True):
        expected = torch.nn.functional.normalize(hidden_states(reference, text)[-1], dim=-1)
        assert list(output.dense.shape) == [128]
        assert torch.allclose(torch.tensor(list(output.dense.values)), expected, atol=TOLERANCE)
    assert response.usage.input_tokens == sum(len(reference.encode(t)) for t in TEXTS)


async def test_token_embeddings_without_normalization(embedder: RunningGateway, reference: Reference) -> None:
    options = pb.EmbedOptions(granularity=pb.TASK_OUTPUT_GRANULARITY_TOKEN, normalize=False)
    request = pb.EmbedRequest(context=context("tokens"), inputs=inputs(TEXTS[0]), options=options)
    (output,) = (await embedder.stub.Embed(request)).outputs
    expected = hidden_states(reference, TEXTS[0])
    assert list(output.dense.shape) == list(expected.shape)
    assert list(output.token_ids) == reference.encode(TEXTS[0])
    assert torch.allclose(torch.tensor(list(output.dense.values)).view(expected.shape), expected, atol=TOLERANCE)


async def test_score_is_the_cosine_similarity(embedder: RunningGateway) -> None:
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text=TEXTS[0]),
        candidates=[pb.TaskInput(item_id="same", text=TEXTS[2]), pb.TaskInput(item_id="other", text=TEXTS[1])],
    )
    response = await embedder.stub.Score(pb.ScoreRequest(context=context("score"), groups=[group]))
    same, other = (c.scores.values[0] for c in response.groups[0].candidates)
    assert same == pytest.approx(1.0, abs=1e-5) and other < same
    assert response.semantics == pb.TASK_VALUE_SEMANTICS_SIMILARITY and response.higher_is_better


async def test_unsupported_options_and_generation_are_rejected(embedder: RunningGateway) -> None:
    dimensions = pb.EmbedRequest(context=context("dims"), inputs=inputs("x"), options=pb.EmbedOptions(dimensions=8))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await embedder.stub.Embed(dimensions)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, "not a Matryoshka model"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(embedder.stub, pb.GenerateRequest(request_id="gen", model=EMBEDDER, prompt="hi"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    classify = pb.ClassifyRequest(context=context("classify"), inputs=inputs("x"))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await embedder.stub.Classify(classify)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    "item",
    [
        pb.TaskInput(item_id="long", token_ids=pb.TokenIds(ids=[5] * (CONTEXT + 88))),
        pb.TaskInput(item_id="oov", token_ids=pb.TokenIds(ids=[5, 99_999])),
    ],
    ids=["longer-than-the-context", "out-of-vocabulary"],
)
async def test_input_vllm_refuses_is_invalid_argument(embedder: RunningGateway, item: pb.TaskInput) -> None:
    """vLLM's own validation of a task input is the caller's error, never INTERNAL."""
    request = pb.EmbedRequest(context=context(f"bad-{item.item_id}"), inputs=[item])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await embedder.stub.Embed(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()


async def test_health_probes_an_embedding_engine_by_embedding(embedder: RunningGateway) -> None:
    health = await embedder.stub.Health(pb.HealthRequest(include_inference_probe=True))
    assert health.state == pb.HEALTH_STATE_READY, health
    assert (health.checks[-1].name, health.checks[-1].message) == ("inference_probe", "embedded an input")


async def test_the_generate_engine_serves_no_task(stub: pb.OpenEngineStub) -> None:
    request = pb.EmbedRequest(context=pb.TaskRequestContext(request_id="e", model="tiny"), inputs=inputs("x"))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Embed(request)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
