"""Embed, Classify and Score outputs honour every option the engine advertises."""

from __future__ import annotations

import math

import numpy as np
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_backends.mock.tokenizer import BOS, VOCAB_SIZE, encode
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    ClassifyCall,
    DenseTensor,
    EmbedCall,
    LoraAdapter,
    ScoreCall,
    ScoreGroupCall,
    SparseTensor,
    TaskContext,
    TaskItem,
)

from .support import engine

CONTEXT = TaskContext("task", "mock")
ITEMS = (TaskItem("a", text="hello world"), TaskItem("b", token_ids=[BOS, 104, 105]))
SEQUENCE, TOKEN = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, pb.TASK_OUTPUT_GRANULARITY_TOKEN


def values(tensor: DenseTensor | SparseTensor) -> np.ndarray:
    assert isinstance(tensor, DenseTensor)
    return np.array(tensor.values).reshape(list(tensor.shape))


async def test_dense_embeddings_default_to_normalized_sequences() -> None:
    async with engine() as backend:
        outputs, usage = await backend.embed(EmbedCall(CONTEXT, ITEMS))
        again, _ = await backend.embed(EmbedCall(CONTEXT, ITEMS))
    assert [list(o.vector.shape) for o in outputs] == [[64], [64]]
    assert all(o.granularity == SEQUENCE and not o.token_ids for o in outputs)
    assert all(math.isclose(np.linalg.norm(values(o.vector)), 1.0, rel_tol=1e-5) for o in outputs)
    assert usage.input_tokens == 12 + 3
    assert outputs == again
    assert not np.allclose(values(outputs[0].vector), values(outputs[1].vector))


async def test_dimensions_reduce_and_normalize_is_honoured() -> None:
    async with engine() as backend:
        (full,), _ = await backend.embed(EmbedCall(CONTEXT, ITEMS[:1], normalize=False))
        (reduced,), _ = await backend.embed(EmbedCall(CONTEXT, ITEMS[:1], normalize=False, dimensions=8))
        (unit,), _ = await backend.embed(EmbedCall(CONTEXT, ITEMS[:1], dimensions=8))
    assert np.linalg.norm(values(full.vector)) > 1.5
    assert np.allclose(values(reduced.vector), values(full.vector)[:8], atol=1e-6)
    assert list(unit.vector.shape) == [8] and math.isclose(np.linalg.norm(values(unit.vector)), 1.0, rel_tol=1e-5)


async def test_token_embeddings_align_with_token_ids() -> None:
    async with engine() as backend:
        outputs, _ = await backend.embed(EmbedCall(CONTEXT, ITEMS, granularity=TOKEN, dimensions=16))
    first = outputs[0]
    assert list(first.vector.shape) == [12, 16] and list(first.token_ids) == encode("hello world")
    assert np.allclose(np.linalg.norm(values(first.vector), axis=1), 1.0, atol=1e-5)


async def test_sparse_embeddings_are_lexical_weights_in_the_native_dimension() -> None:
    async with engine() as backend:
        (sequence,), _ = await backend.embed(EmbedCall(CONTEXT, ITEMS[:1], encoding=pb.EMBEDDING_ENCODING_SPARSE))
        (unit,), _ = await backend.embed(
            EmbedCall(CONTEXT, ITEMS[:1], encoding=pb.EMBEDDING_ENCODING_SPARSE, normalize=True)
        )
        (tokens,), _ = await backend.embed(
            EmbedCall(CONTEXT, ITEMS[1:], encoding=pb.EMBEDDING_ENCODING_SPARSE, granularity=TOKEN)
        )
        with pytest.raises(InvalidArgument, match="dense"):
            await backend.embed(EmbedCall(CONTEXT, ITEMS, encoding=pb.EMBEDDING_ENCODING_SPARSE, dimensions=4))
    dimension = MockSettings().embedding_dimension  # one native dimension, dense and sparse alike
    sparse = sequence.vector
    assert isinstance(sparse, SparseTensor) and isinstance(tokens.vector, SparseTensor)
    assert list(sparse.shape) == [dimension]
    assert list(sparse.indices) == sorted({token % dimension for token in encode("hello world")})
    weights = dict(zip(sparse.indices, sparse.values, strict=True))
    assert weights[ord("l") % dimension] > weights[ord("h") % dimension] * 0.5  # 'l' occurs three times
    assert math.isclose(np.linalg.norm(unit.vector.values), 1.0, rel_tol=1e-5)
    assert list(tokens.vector.shape) == [3, dimension]
    assert list(tokens.vector.indices) == [row * dimension + t % dimension for row, t in enumerate([BOS, 104, 105])]
    assert list(tokens.token_ids) == [BOS, 104, 105]


async def test_classification_semantics() -> None:
    async with engine() as backend:
        (logits,), _ = await backend.classify(ClassifyCall(CONTEXT, ITEMS[:1]))
        (probs,), _ = await backend.classify(
            ClassifyCall(CONTEXT, ITEMS[:1], semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES)
        )
        (logs,), _ = await backend.classify(
            ClassifyCall(CONTEXT, ITEMS[:1], semantics=pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES)
        )
        (per_token,), _ = await backend.classify(ClassifyCall(CONTEXT, ITEMS[1:], granularity=TOKEN))
    assert logits.semantics == pb.TASK_VALUE_SEMANTICS_LOGITS and list(logits.labels) == [
        "negative",
        "neutral",
        "positive",
    ]
    raw = values(logits.scores)
    expected = np.exp(raw - raw.max()) / np.exp(raw - raw.max()).sum()
    assert np.allclose(values(probs.scores), expected, atol=1e-6)
    assert np.allclose(values(logs.scores), np.log(expected), atol=1e-5)
    assert list(per_token.scores.shape) == [3, 3] and list(per_token.token_ids) == [BOS, 104, 105]


def score_call(*candidates: str, **options: object) -> ScoreCall:
    group = ScoreGroupCall("g", TaskItem("q", text="what is a cat"), tuple(TaskItem(c, text=c) for c in candidates))
    return ScoreCall(CONTEXT, (group,), **options)  # type: ignore[arg-type]


async def test_native_score_is_similarity() -> None:
    async with engine() as backend:
        result, usage = await backend.score(score_call("what is a cat", "zzzz qqqq"))
        instructed, _ = await backend.score(score_call("what is a cat", instruction="Find answers: "))
        with pytest.raises(InvalidArgument, match="SOFTMAX"):
            await backend.score(score_call("x", normalization=pb.SCORE_NORMALIZATION_SOFTMAX))
        with pytest.raises(InvalidArgument, match="semantics"):
            await backend.score(score_call("x", semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES))
    same, other = (c.scores.values[0] for c in result.groups[0])
    assert math.isclose(same, 1.0, rel_tol=1e-5) and other < same
    assert (result.semantics, result.normalization, result.higher_is_better) == (
        pb.TASK_VALUE_SEMANTICS_SIMILARITY,
        pb.SCORE_NORMALIZATION_NONE,
        True,
    )
    assert instructed.groups[0][0].scores.values[0] < same
    assert usage.input_tokens == 14 + 14 + 10  # query, then each candidate after its BOS


async def test_label_token_scores_are_next_token_logprobs(tmp_path: object) -> None:
    labels = (ord("Y"), ord("N"))
    async with engine() as backend:
        raw, _ = await backend.score(score_call("a pet", label_token_ids=labels))
        soft, _ = await backend.score(
            score_call("a pet", label_token_ids=labels, normalization=pb.SCORE_NORMALIZATION_SOFTMAX)
        )
        by_semantics, _ = await backend.score(
            score_call("a pet", label_token_ids=labels, semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES)
        )
        model = backend.model
        await backend.load_lora(LoraAdapter(3, "l", str(tmp_path)))
        adapted, _ = await backend.score(
            ScoreCall(TaskContext("t", "mock", lora_name="l"), score_call("a pet").groups, label_token_ids=labels)
        )
    row = model.row(encode("what is a cata pet"))
    expected = [model.logprob(row, t) for t in labels]
    assert np.allclose(raw.groups[0][0].scores.values, expected, atol=1e-5)
    assert (
        raw.semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES and raw.normalization == pb.SCORE_NORMALIZATION_NONE
    )
    probabilities = np.exp(expected) / np.exp(expected).sum()
    assert np.allclose(soft.groups[0][0].scores.values, probabilities, atol=1e-6)
    assert soft.semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES
    assert by_semantics.normalization == pb.SCORE_NORMALIZATION_SOFTMAX
    assert not np.allclose(adapted.groups[0][0].scores.values, expected)


async def test_adapters_change_task_outputs(tmp_path: object) -> None:
    async with engine() as backend:
        await backend.load_lora(LoraAdapter(1, "one", str(tmp_path)))
        (base,), _ = await backend.embed(EmbedCall(CONTEXT, ITEMS[:1]))
        (adapted,), _ = await backend.embed(EmbedCall(TaskContext("t", "mock", lora_name="one"), ITEMS[:1]))
    assert not np.allclose(values(base.vector), values(adapted.vector))


async def test_task_inputs_are_validated() -> None:
    backend: MockBackend
    async with engine(max_context_length=16, max_output_tokens=8, total_kv_blocks=4, kv_block_size=4) as backend:
        with pytest.raises(InvalidArgument, match="vocabulary"):
            await backend.embed(EmbedCall(CONTEXT, (TaskItem("x", token_ids=[VOCAB_SIZE]),)))
        with pytest.raises(InvalidArgument, match="context"):
            await backend.classify(ClassifyCall(CONTEXT, (TaskItem("x", text="y" * 20),)))
        with pytest.raises(InvalidArgument, match="vocabulary"):
            await backend.score(score_call("x", label_token_ids=(VOCAB_SIZE,)))
