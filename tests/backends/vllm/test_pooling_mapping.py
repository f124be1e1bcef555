"""Embed, Classify and Score: capabilities, options → ``PoolingParams``, outputs → messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from openengine_backends.vllm import pooling
from openengine_backends.vllm.pooling import PoolingModel
from openengine_gateway import pb
from openengine_gateway.contract.capabilities import check_model_info
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import ClassifyCall, DenseTensor, EmbedCall, TaskContext, TaskItem, TaskUsage

SEQ, TOK = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, pb.TASK_OUTPUT_GRANULARITY_TOKEN
EMBEDDER = PoolingModel(tasks=("embed", "token_embed"), dimension=4)
CLASSIFIER = PoolingModel(tasks=("classify", "token_classify"), dimension=4, labels=("no", "yes"))
CONTEXT = TaskContext("t", "m")
ITEMS = (TaskItem("a", text="hi"),)


def test_an_embedding_engine_advertises_embed_and_similarity_score() -> None:
    tasks = pooling.task_capabilities(EMBEDDER)
    assert tasks is not None
    check_model_info(pb.ModelInfo(tasks=tasks))
    assert list(tasks.embed.granularities) == [SEQ, TOK] and tasks.embed.dimension == 4
    assert tasks.embed.supports_normalization and not tasks.embed.supports_dimension_override
    assert list(tasks.embed.encodings) == [pb.EMBEDDING_ENCODING_DENSE]
    assert tasks.score.higher_is_better and list(tasks.score.semantics) == [pb.TASK_VALUE_SEMANTICS_SIMILARITY]
    assert not tasks.score.supports_label_token_scoring and not tasks.HasField("classify")


def test_a_classifier_advertises_classify_only() -> None:
    tasks = pooling.task_capabilities(CLASSIFIER)
    assert tasks is not None and not tasks.HasField("embed") and not tasks.HasField("score")
    assert list(tasks.classify.semantics) == [pb.TASK_VALUE_SEMANTICS_PROBABILITIES, pb.TASK_VALUE_SEMANTICS_LOGITS]
    assert pooling.task_capabilities(PoolingModel(tasks=("generate",), dimension=4)) is None


def test_embed_options_map_to_pooling_params() -> None:
    assert pooling.embed_params(EmbedCall(CONTEXT, ITEMS), EMBEDDER) == (SEQ, {"task": "embed"})
    call = EmbedCall(CONTEXT, ITEMS, granularity=TOK, normalize=False, dimensions=2)
    assert pooling.embed_params(call, EMBEDDER) == (
        TOK,
        {"task": "token_embed", "use_activation": False, "dimensions": 2},
    )


def test_classify_semantics_are_the_activation() -> None:
    assert pooling.classify_params(ClassifyCall(CONTEXT, ITEMS), CLASSIFIER) == (
        SEQ,
        pb.TASK_VALUE_SEMANTICS_PROBABILITIES,
        {"task": "classify"},
    )
    logits = ClassifyCall(CONTEXT, ITEMS, granularity=TOK, semantics=pb.TASK_VALUE_SEMANTICS_LOGITS)
    assert pooling.classify_params(logits, CLASSIFIER) == (
        TOK,
        pb.TASK_VALUE_SEMANTICS_LOGITS,
        {"task": "token_classify", "use_activation": False},
    )
    raw = PoolingModel(tasks=("classify",), dimension=4, activation_default=False)
    assert pooling.classify_params(ClassifyCall(CONTEXT, ITEMS), raw)[1] == pb.TASK_VALUE_SEMANTICS_LOGITS


class Tensor:
    """A tensor-like with ``tolist`` (vLLM's pooling outputs are torch tensors)."""

    def __init__(self, data: list[float] | list[list[float]]) -> None:
        self.data = data

    def tolist(self) -> list[float] | list[list[float]]:
        return self.data


def test_outputs_are_row_major_tensors_with_aligned_token_ids() -> None:
    sequence = pooling.embedding_output(Tensor([0.5, 1.0]), SEQ, [0, 7])
    assert sequence.vector == DenseTensor(shape=[2], values=[0.5, 1.0]) and not sequence.token_ids
    token = pooling.embedding_output(Tensor([[1.0, 2.0], [3.0, 4.0]]), TOK, [0, 7])
    assert list(token.vector.shape) == [2, 2] and list(token.vector.values) == [1, 2, 3, 4]
    assert list(token.token_ids) == [0, 7]
    labelled = pooling.classification_output(
        Tensor([0.25, 0.75]), SEQ, pb.TASK_VALUE_SEMANTICS_PROBABILITIES, [0], ("no", "yes")
    )
    assert list(labelled.labels) == ["no", "yes"]
    unlabelled = pooling.classification_output(
        Tensor([0.1, 0.2, 0.7]), SEQ, pb.TASK_VALUE_SEMANTICS_LOGITS, [0], ("no", "yes")
    )
    assert not unlabelled.labels


def test_cosine_and_usage() -> None:
    assert pooling.cosine([1.0, 0.0], [0.0, 2.0]) == 0.0
    assert pooling.cosine([1.0, 1.0], [2.0, 2.0]) == pytest.approx(1.0)
    assert pooling.cosine([0.0, 0.0], [1.0, 0.0]) == 0.0

    class Out:
        def __init__(self, ids: list[int], cached: int | None) -> None:
            self.prompt_token_ids, self.num_cached_tokens = ids, cached

    assert pooling.usage([Out([1, 2], 0), Out([3], None)]) == TaskUsage(input_tokens=3, cached_input_tokens=0)


def test_task_prompts() -> None:
    assert pooling.item_prompt(TaskItem("a", text="hi")) == {"prompt": "hi"}
    assert pooling.item_prompt(TaskItem("a", token_ids=[1, 2])) == {"prompt_token_ids": [1, 2]}
    with pytest.raises(InvalidArgument, match="media"):
        pooling.item_prompt(TaskItem("a", media=(object(),)))  # type: ignore[arg-type]


async def test_the_first_failing_item_fails_the_call_and_stops_the_others() -> None:
    """No item outlives its call: closing a vLLM request stream aborts that request."""
    closed: list[str] = []

    class Engine:
        async def encode(self, _prompt: object, _params: object, item_id: str, **_: object) -> AsyncIterator[object]:
            try:
                if item_id.endswith("#1"):
                    raise ValueError("token id 99999 is out of vocabulary")
                await asyncio.Event().wait()
                yield None
            finally:
                closed.append(item_id)

        async def abort(self, item_ids: list[str]) -> None:
            closed.append(f"batch {item_ids}")

    engine = pooling.PoolingEngine(Engine(), EMBEDDER, dict)
    items = (TaskItem("a", text="hi"), TaskItem("b", token_ids=[99_999]))
    with pytest.raises(ValueError, match="out of vocabulary"):
        await engine.encode("call", items, {}, None, None)
    assert closed == ["call#1", "batch ['call#0']", "call#0"] and engine.item_ids("call") == ["call"]


async def test_a_cancelled_call_aborts_its_running_items_in_one_batch() -> None:
    """Cancelled one by one, each item would abort itself in vLLM, and each abort rescans its queue:
    quadratic for a large call (30,000 items stalled the engine for 17 s). vLLM ends each item of a
    batched abort with a final output instead, so none aborts itself."""
    aborts: list[list[str]] = []
    ended: dict[str, asyncio.Event] = {}

    class Engine:
        async def encode(self, _prompt: object, _params: object, item_id: str, **_: object) -> AsyncIterator[object]:
            ended[item_id] = asyncio.Event()
            try:
                await ended[item_id].wait()
                yield "aborted"  # vLLM's final output for an aborted request
            except asyncio.CancelledError:
                aborts.append([item_id])  # what vLLM's encode does when it is cancelled
                raise

        async def abort(self, item_ids: list[str]) -> None:
            aborts.append(item_ids)
            for item_id in item_ids:
                ended[item_id].set()

    engine = pooling.PoolingEngine(Engine(), EMBEDDER, dict)
    items = [TaskItem(str(n), text="hi") for n in range(100)]
    call = asyncio.ensure_future(engine.encode("call", items, {}, None, None))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert aborts == [[f"call#{n}" for n in range(100)]]
