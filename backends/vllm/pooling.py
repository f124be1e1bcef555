"""Embed, Classify and Score on vLLM's pooling runner (``--runner pooling``).

The capability table and the request/response mapping are pure functions. ``PoolingEngine``
runs the items of one call concurrently through ``AsyncLLM.encode``, each under its own vLLM
request id (``<request_id>#<index>``) so an abort reaches all of them; vLLM's
``PoolingParams`` class is handed in by ``tasks.py``, so this module never imports vLLM.

* Embed: ``embed`` (sequence) and ``token_embed`` (token) pooling tasks; ``normalize`` is
  vLLM's ``use_activation`` for embeddings; ``dimensions`` only for Matryoshka models.
* Classify: ``classify``/``token_classify``; probabilities are the model's activation
  (``use_activation``), logits are without it; labels from the model's ``id2label``.
* Score: bi-encoder cosine similarity of sequence embeddings (engines with ``embed``);
  label-token scoring and instructions are not offered.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    CandidateScore,
    Classification,
    ClassifyCall,
    DenseTensor,
    EmbedCall,
    Embedding,
    ScoreCall,
    ScoreResult,
    TaskItem,
    TaskUsage,
)

SEQUENCE, TOKEN = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, pb.TASK_OUTPUT_GRANULARITY_TOKEN
_INPUTS = (pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_TOKEN_IDS)


@dataclass(frozen=True, slots=True)
class PoolingModel:
    """What the pooling mapping needs to know about the served model."""

    tasks: tuple[str, ...]
    dimension: int
    labels: tuple[str, ...] = ()
    matryoshka: bool = False
    activation_default: bool = True
    """vLLM applies the pooler's activation unless the pooler config turns it off."""
    lora: bool = False
    priority: bool = False
    text: bool = True


Granularity: TypeAlias = pb.TaskOutputGranularity.ValueType
Semantics: TypeAlias = pb.TaskValueSemantics.ValueType


def _granularities(model: PoolingModel, sequence_task: str, token_task: str) -> list[Granularity]:
    return [g for g, task in ((SEQUENCE, sequence_task), (TOKEN, token_task)) if task in model.tasks]


def task_capabilities(model: PoolingModel) -> pb.TaskCapabilities | None:
    """The task table of a pooling engine (None when it serves no pooling task)."""
    inputs = _INPUTS if model.text else (pb.TASK_INPUT_TYPE_TOKEN_IDS,)
    tasks = pb.TaskCapabilities()
    embed = _granularities(model, "embed", "token_embed")
    classify = _granularities(model, "classify", "token_classify")
    if not embed and not classify:
        return None
    if embed:
        tasks.embed.CopyFrom(
            pb.EmbedCapabilities(
                supported=True,
                granularities=embed,
                encodings=[pb.EMBEDDING_ENCODING_DENSE],
                dimension=model.dimension,
                supports_normalization=True,
                supports_dimension_override=model.matryoshka,
                input_types=inputs,
                supports_lora=model.lora,
                supports_priority=model.priority,
            )
        )
    if classify:
        tasks.classify.CopyFrom(
            pb.ClassifyCapabilities(
                supported=True,
                granularities=classify,
                semantics=[pb.TASK_VALUE_SEMANTICS_PROBABILITIES, pb.TASK_VALUE_SEMANTICS_LOGITS],
                input_types=inputs,
                supports_lora=model.lora,
                supports_priority=model.priority,
            )
        )
    if "embed" in model.tasks:
        tasks.score.CopyFrom(
            pb.ScoreCapabilities(
                supported=True,
                granularities=[SEQUENCE],
                semantics=[pb.TASK_VALUE_SEMANTICS_SIMILARITY],
                normalizations=[pb.SCORE_NORMALIZATION_NONE],
                supports_label_token_scoring=False,
                supports_instruction=False,
                higher_is_better=True,
                input_types=inputs,
                supports_lora=model.lora,
                supports_priority=model.priority,
            )
        )
    return tasks


def embed_params(call: EmbedCall, model: PoolingModel) -> tuple[Granularity, dict[str, Any]]:
    """The granularity served and the ``PoolingParams`` keyword arguments of an Embed call."""
    granularity = call.granularity or (SEQUENCE if "embed" in model.tasks else TOKEN)
    params: dict[str, Any] = {"task": "embed" if granularity == SEQUENCE else "token_embed"}
    if call.normalize is not None:
        params["use_activation"] = call.normalize
    if call.dimensions is not None:
        params["dimensions"] = call.dimensions
    return granularity, params


def classify_params(call: ClassifyCall, model: PoolingModel) -> tuple[Granularity, Semantics, dict[str, Any]]:
    """Granularity, semantics and ``PoolingParams`` keyword arguments of a Classify call."""
    granularity = call.granularity or (SEQUENCE if "classify" in model.tasks else TOKEN)
    params: dict[str, Any] = {"task": "classify" if granularity == SEQUENCE else "token_classify"}
    activation = model.activation_default
    if call.semantics is not None:
        activation = call.semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES
        params["use_activation"] = activation
    semantics = pb.TASK_VALUE_SEMANTICS_PROBABILITIES if activation else pb.TASK_VALUE_SEMANTICS_LOGITS
    return granularity, semantics, params


def dense(values: Any) -> DenseTensor:
    """A tensor-like (``tolist``), nested lists, or numbers as a row-major ``DenseTensor``."""
    data = values.tolist() if hasattr(values, "tolist") else values
    if not isinstance(data, list):
        data = [data]
    shape = [len(data)]
    if data and isinstance(data[0], list):
        shape.append(len(data[0]))
        data = [value for row in data for value in row]
    return DenseTensor(shape=shape, values=data)


def embedding_output(data: Any, granularity: Granularity, prompt_ids: Sequence[int]) -> Embedding:
    """One embedding; token embeddings carry their aligned token ids."""
    return Embedding(granularity, dense(data), token_ids=prompt_ids if granularity == TOKEN else ())


def classification_output(
    data: Any, granularity: Granularity, semantics: Semantics, prompt_ids: Sequence[int], labels: Sequence[str]
) -> Classification:
    """One classification; labels when the model names exactly its classes."""
    scores = dense(data)
    return Classification(
        granularity,
        semantics,
        scores,
        labels=labels if labels and len(labels) == scores.shape[-1] else (),
        token_ids=prompt_ids if granularity == TOKEN else (),
    )


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity (0 for a zero vector)."""
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0


def item_prompt(item: TaskItem) -> dict[str, Any]:
    """vLLM's prompt dictionary for a task item (media items are not offered)."""
    if item.media:
        raise InvalidArgument("this vLLM engine takes no media in task inputs")
    return {"prompt": item.text} if item.text is not None else {"prompt_token_ids": list(item.token_ids or ())}


def usage(outputs: Sequence[Any]) -> TaskUsage:
    """Input tokens and prefix-cache hits over every item."""
    return TaskUsage(
        input_tokens=sum(len(out.prompt_token_ids) for out in outputs),
        cached_input_tokens=sum(out.num_cached_tokens or 0 for out in outputs),
    )


class PoolingEngine:
    """Runs task calls on a started ``AsyncLLM`` with the pooling runner."""

    def __init__(self, engine: Any, model: PoolingModel, params_class: Callable[..., Any]) -> None:
        self._engine = engine
        self.model = model
        self._params = params_class
        self._items: dict[str, list[str]] = {}

    def item_ids(self, request_id: str) -> list[str]:
        """vLLM request ids of a call in flight (its items); ``[request_id]`` otherwise."""
        return self._items.get(request_id, [request_id])

    async def encode(
        self, request_id: str, items: Sequence[TaskItem], params: Mapping[str, Any], lora: Any, priority: int | None
    ) -> list[Any]:
        """Every item's final ``PoolingRequestOutput``, in order.

        The first item to fail fails the call and stops the others, so no item outlives its call.
        What is still running then (or when the call is cancelled) is aborted in one batch, which
        ends each item with vLLM's final abort output. Cancelled instead, each item would abort
        itself, one engine message each, and each such abort rescans the scheduler's waiting queue:
        for a large call that stalls the engine for seconds to minutes.
        """
        prompts = [item_prompt(item) for item in items]
        ids = [f"{request_id}#{index}" for index in range(len(items))]
        self._items[request_id] = ids
        runs = [
            asyncio.ensure_future(self._one(i, prompt, params, lora, priority))
            for i, prompt in zip(ids, prompts, strict=True)
        ]
        try:
            await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
            failure = next((error for run in runs if run.done() and (error := run.exception()) is not None), None)
            if failure is not None:
                raise failure
            return [run.result() for run in runs]
        finally:
            self._items.pop(request_id, None)
            running = [(item_id, run) for item_id, run in zip(ids, runs, strict=True) if not run.done()]
            if running:
                await self._engine.abort([item_id for item_id, _ in running])
                await asyncio.sleep(0)  # each aborted item takes its final output and returns
                stuck = [run for _, run in running if not run.done()]  # not in vLLM yet: cancelled before it is
                for run in stuck:
                    run.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)

    async def _one(
        self, item_id: str, prompt: dict[str, Any], params: Mapping[str, Any], lora: Any, priority: int | None
    ) -> Any:
        final = None
        async for output in self._engine.encode(
            prompt, self._params(**params), item_id, lora_request=lora, priority=-(priority or 0)
        ):
            final = output
        return final

    async def embed(self, call: EmbedCall, lora: Any) -> tuple[list[Embedding], TaskUsage]:
        """Embeddings of every item."""
        granularity, params = embed_params(call, self.model)
        outputs = await self.encode(call.context.request_id, call.items, params, lora, call.context.priority)
        return [embedding_output(o.outputs.data, granularity, o.prompt_token_ids) for o in outputs], usage(outputs)

    async def classify(self, call: ClassifyCall, lora: Any) -> tuple[list[Classification], TaskUsage]:
        """Class scores of every item."""
        granularity, semantics, params = classify_params(call, self.model)
        outputs = await self.encode(call.context.request_id, call.items, params, lora, call.context.priority)
        results = [
            classification_output(o.outputs.data, granularity, semantics, o.prompt_token_ids, self.model.labels)
            for o in outputs
        ]
        return results, usage(outputs)

    async def score(self, call: ScoreCall, lora: Any) -> tuple[ScoreResult, TaskUsage]:
        """Cosine similarity of each candidate's embedding to its group's query embedding."""
        if "embed" not in self.model.tasks:
            raise InvalidArgument("this vLLM engine scores by embedding similarity and serves no sequence embeddings")
        items = [item for group in call.groups for item in (group.query, *group.candidates)]
        outputs = await self.encode(call.context.request_id, items, {"task": "embed"}, lora, call.context.priority)
        vectors = [o.outputs.data.tolist() for o in outputs]
        groups = []
        position = 0
        for group in call.groups:
            query = vectors[position]
            groups.append(
                [
                    CandidateScore(DenseTensor(shape=[1], values=[cosine(query, vectors[position + offset])]))
                    for offset in range(1, len(group.candidates) + 1)
                ]
            )
            position += 1 + len(group.candidates)
        result = ScoreResult(
            SEQUENCE, pb.TASK_VALUE_SEMANTICS_SIMILARITY, pb.SCORE_NORMALIZATION_NONE, groups, higher_is_better=True
        )
        return result, usage(outputs)


__all__ = [
    "PoolingEngine",
    "PoolingModel",
    "classification_output",
    "classify_params",
    "cosine",
    "dense",
    "embed_params",
    "embedding_output",
    "item_prompt",
    "task_capabilities",
    "usage",
]
