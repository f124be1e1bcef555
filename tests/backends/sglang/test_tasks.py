"""Embed, Classify and Score through the gateway on the fake SGLang's three kinds of model."""

from __future__ import annotations

import math
import types

import grpc
import pytest
from openengine_gateway import pb

from ..fake_serving import MODEL, serving
from . import fake_engine
from .conftest import sglang
from .fake_api import Tokenizer


def context(request_id: str = "t") -> pb.TaskRequestContext:
    return pb.TaskRequestContext(request_id=request_id, model=MODEL)


async def test_embeddings_of_text_and_token_ids(fake: types.ModuleType) -> None:
    inputs = [pb.TaskInput(item_id="a", text="hello"), pb.TaskInput(item_id="b", token_ids=pb.TokenIds(ids=[1, 2]))]
    async with serving(sglang("/models/fake-embed", is_embedding=True)) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        response = await running.stub.Embed(pb.EmbedRequest(context=context(), inputs=inputs))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.Generate(pb.GenerateRequest(model=MODEL, prompt="x")).read()
    assert not info.HasField("generation") and info.tasks.embed.supported
    assert [list(o.dense.shape) for o in response.outputs] == [[4], [4]]
    assert response.outputs[0].dense.values[1] == pytest.approx(math.sin(6), abs=1e-6)
    assert response.usage.input_tokens == 7
    sent = fake_engine.ENGINES[0].tokenizer_manager.received
    assert [(r.text, r.input_ids) for r in sent] == [("hello", None), (None, [1, 2])]
    assert len({r.rid for r in sent}) == 2
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_classification_logits_probabilities_and_labels(fake: types.ModuleType) -> None:
    inputs = [pb.TaskInput(item_id="a", text="abcd")]
    async with serving(sglang("/models/fake-classifier")) as running:
        logits = await running.stub.Classify(pb.ClassifyRequest(context=context(), inputs=inputs))
        options = pb.ClassifyOptions(output_semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES)
        probabilities = await running.stub.Classify(
            pb.ClassifyRequest(context=context("u"), inputs=inputs, options=options)
        )
    (output,) = logits.outputs
    assert output.semantics == pb.TASK_VALUE_SEMANTICS_LOGITS and list(output.scores.values) == [1.0, -1.0]
    assert list(output.labels) == ["negative", "positive"]
    values = probabilities.outputs[0].scores.values
    assert math.fsum(values) == pytest.approx(1.0) and values[0] == pytest.approx(1 / (1 + math.exp(-2)))


async def test_cross_encoder_scores_on_a_classifier(fake: types.ModuleType) -> None:
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text="what"),
        candidates=[pb.TaskInput(item_id="c0", text="x"), pb.TaskInput(item_id="c1", text="yz")],
    )
    async with serving(sglang("/models/fake-classifier")) as running:
        response = await running.stub.Score(pb.ScoreRequest(context=context(), groups=[group]))
    (sent,) = fake_engine.ENGINES[0].tokenizer_manager.received  # one batch of pairs, as SGLang's rerank sends
    assert (sent.text, sent.is_cross_encoder_request) == ([["what", "x"], ["what", "yz"]], True)
    assert isinstance(sent.rid, list) and len(sent.rid) == 2
    assert response.semantics == pb.TASK_VALUE_SEMANTICS_LOGITS and response.higher_is_better
    assert [len(c.scores.values) for c in response.groups[0].candidates] == [2, 2]


async def test_a_candidate_continues_its_query_without_a_second_bos(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tokenizer that adds a BOS, only the query (the sequence's start) gets one."""
    monkeypatch.setattr(Tokenizer, "bos", 1)
    candidates = [pb.TaskInput(item_id="c", text=" so")]
    group = pb.ScoreGroup(group_id="g", query=pb.TaskInput(item_id="q", text="is"), candidates=candidates)
    async with serving(sglang()) as running:
        await running.stub.Score(pb.ScoreRequest(context=context(), groups=[group]))
    (sent,) = fake_engine.ENGINES[0].tokenizer_manager.received
    assert sent.input_ids == [1, *(ord(c) for c in "is so")] and sent.logprob_start_len == 2


async def test_label_token_scores_on_a_generation_model(fake: types.ModuleType) -> None:
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text="is it"),
        candidates=[pb.TaskInput(item_id="c", text=" so")],
    )
    options = pb.ScoreOptions(label_token_ids=[ord("h"), ord("e")], normalization=pb.SCORE_NORMALIZATION_SOFTMAX)
    async with serving(sglang()) as running:
        response = await running.stub.Score(pb.ScoreRequest(context=context(), groups=[group], options=options))
    (candidate,) = response.groups[0].candidates
    logprobs = fake_engine.distribution(8)
    expected = [math.exp(logprobs[t]) for t in (ord("h"), ord("e"))]
    assert list(candidate.scores.values) == pytest.approx([p / sum(expected) for p in expected])
    assert response.normalization == pb.SCORE_NORMALIZATION_SOFTMAX and list(response.label_token_ids) == [104, 101]
    assert response.usage.input_tokens == 8


async def test_label_token_scores_join_query_and_candidate_text_before_tokenizing(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang scores ``f"{query}{item}"`` as one text: a BOS tokenizer adds one BOS, not one per part."""
    monkeypatch.setattr(Tokenizer, "bos", 2)
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text="is it"),
        candidates=[pb.TaskInput(item_id="c", text=" so")],
    )
    options = pb.ScoreOptions(label_token_ids=[ord("h")])
    async with serving(sglang()) as running:
        response = await running.stub.Score(pb.ScoreRequest(context=context(), groups=[group], options=options))
    (candidate,) = response.groups[0].candidates
    assert list(candidate.scores.values) == pytest.approx([math.exp(fake_engine.distribution(9)[ord("h")])])
    assert response.usage.input_tokens == 9, "BOS + 'is it so'"


async def test_native_scores_of_a_generation_model_are_candidate_log_likelihoods(fake: types.ModuleType) -> None:
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text="is it"),
        candidates=[pb.TaskInput(item_id="c", text=" so"), pb.TaskInput(item_id="d", token_ids=pb.TokenIds(ids=[9]))],
    )
    async with serving(sglang()) as running:
        response = await running.stub.Score(pb.ScoreRequest(context=context(), groups=[group]))
        options = pb.ScoreOptions(output_semantics=pb.TASK_VALUE_SEMANTICS_LOGITS)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.Score(pb.ScoreRequest(context=context("u"), groups=[group], options=options))
    ids = [ord(c) for c in "is it so"]
    expected = math.fsum(fake_engine.distribution(p)[ids[p]] for p in (5, 6, 7))
    first, second = response.groups[0].candidates
    assert response.semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES and response.higher_is_better
    assert list(first.scores.values) == pytest.approx([expected])
    assert list(second.scores.values) == pytest.approx([fake_engine.distribution(5)[9]])
    sent = fake_engine.ENGINES[0].tokenizer_manager.received
    assert [(r.logprob_start_len, r.sampling_params) for r in sent] == [(4, {"max_new_tokens": 0})] * 2
    assert response.usage.input_tokens == 14
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (503, grpc.StatusCode.RESOURCE_EXHAUSTED, "SGLang is overloaded: The request queue is full."),
        (500, grpc.StatusCode.INTERNAL, "SGLang failed (HTTP 500): The request queue is full."),
        (400, grpc.StatusCode.INVALID_ARGUMENT, "SGLang rejected the request: The request queue is full."),
    ],
)
async def test_an_aborted_task_reaches_the_caller_with_the_status_sglang_gave(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch, status: int, code: grpc.StatusCode, message: str
) -> None:
    """A non-streamed request SGLang aborts raises ``fastapi.HTTPException`` (``ValueError`` for 400)."""
    monkeypatch.setattr(fake_engine, "TASK_ABORT", (status, "The request queue is full."))
    inputs = [pb.TaskInput(item_id="a", text="hello")]
    async with serving(sglang("/models/fake-embed", is_embedding=True)) as running:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.Embed(pb.EmbedRequest(context=context(), inputs=inputs))
        monkeypatch.setattr(fake_engine, "TASK_ABORT", None)
        again = await running.stub.Embed(pb.EmbedRequest(context=context(), inputs=inputs))
    assert (error.value.code(), error.value.details()) == (code, message)
    assert len(again.outputs) == 1, "the request id is free again"
