"""Embed, Classify and Score on SGLang: the capability table, the mapping, and a small runner.

* Embed: embedding models (``--is-embedding``), one ``EmbeddingReqInput`` per item (text, token
  ids, or an image with its prompt on multimodal models); sequence granularity, dense; SGLang
  applies the model's own normalization, so an explicit ``normalize`` is not offered;
  ``dimensions`` on Matryoshka models.
* Classify: sequence-classification models served the same way; SGLang returns the head's
  logits, and probabilities are their softmax, as SGLang's ``/v1/classify`` computes them.
* Score on generation models: with ``label_token_ids``, SGLang's label-token scoring
  (``Engine.async_score``: each label token's probability after query + candidate, optionally
  softmaxed across the labels); without, the causal model's native score, the candidate's
  log-likelihood after the query, summed from SGLang's prompt logprobs of a prefill-only request.
* Score on sequence-classification models: cross-encoder scores of (query, candidate) text
  pairs, as SGLang's ``/v1/rerank`` computes them.

The runner takes the engine and SGLang's request classes from ``engine.py``, so this module never
imports SGLang. Every item runs under its own SGLang request id so an abort reaches it, and a
failing item aborts its siblings; ``async_score`` takes no request id, so a label-token Score runs
to its end inside SGLang.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
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
    TaskContext,
    TaskItem,
    TaskUsage,
)

from .capabilities import EngineState, engine_role, lora_enabled
from .mapping import EngineLimits, media_kwargs, sglang_priority, tokenize

SEQUENCE = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE
LOGITS, PROBABILITIES = pb.TASK_VALUE_SEMANTICS_LOGITS, pb.TASK_VALUE_SEMANTICS_PROBABILITIES
LOG_PROBABILITIES = pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
NONE, SOFTMAX = pb.SCORE_NORMALIZATION_NONE, pb.SCORE_NORMALIZATION_SOFTMAX
_TEXT_AND_IDS = (pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_TOKEN_IDS)
Semantics: TypeAlias = pb.TaskValueSemantics.ValueType


def task_capabilities(state: EngineState) -> pb.TaskCapabilities | None:
    """The task table of a started engine (None when it serves no task)."""
    server = state.server
    lora, priority = lora_enabled(server), bool(server.get("enable_priority_scheduling"))
    inputs = list(_TEXT_AND_IDS if state.has_tokenizer else (pb.TASK_INPUT_TYPE_TOKEN_IDS,))
    tasks = pb.TaskCapabilities()
    if state.is_generation:
        if not state.has_tokenizer or engine_role(server) != pb.ENGINE_ROLE_AGGREGATED:
            return None  # a prefill or decode engine runs only its half of a generation
        tasks.score.CopyFrom(
            pb.ScoreCapabilities(
                supported=True,
                input_types=inputs,
                granularities=[SEQUENCE],
                semantics=[PROBABILITIES, LOG_PROBABILITIES],
                normalizations=[NONE, SOFTMAX],
                supports_label_token_scoring=True,
                supports_instruction=False,
                supports_lora=False,
                supports_priority=False,
                higher_is_better=True,
            )
        )
        return tasks
    common: dict[str, Any] = {"supported": True, "granularities": [SEQUENCE], "supports_lora": lora}
    common["supports_priority"] = priority
    if state.classifier:
        tasks.classify.CopyFrom(
            pb.ClassifyCapabilities(input_types=inputs, semantics=[LOGITS, PROBABILITIES], **common)
        )
        if state.has_tokenizer:
            tasks.score.CopyFrom(
                pb.ScoreCapabilities(
                    input_types=[pb.TASK_INPUT_TYPE_TEXT],
                    semantics=[LOGITS, PROBABILITIES],
                    normalizations=[NONE, SOFTMAX],
                    supports_label_token_scoring=False,
                    supports_instruction=False,
                    higher_is_better=True,
                    **common,
                )
            )
        return tasks
    embed = pb.EmbedCapabilities(
        input_types=inputs,
        encodings=[pb.EMBEDDING_ENCODING_DENSE],
        supports_normalization=False,
        supports_dimension_override=state.matryoshka,
        **common,
    )
    if state.is_multimodal:
        embed.input_types.append(pb.TASK_INPUT_TYPE_MULTIMODAL)
        embed.modalities.append(pb.MODALITY_IMAGE)
    tasks.embed.CopyFrom(embed)
    return tasks


def item_kwargs(item: TaskItem) -> dict[str, Any]:
    """``EmbeddingReqInput`` fields of one item: its text or token ids, and its images."""
    kwargs: dict[str, Any] = media_kwargs(item.media)
    if item.text is not None:
        kwargs["text"] = item.text
    elif item.token_ids is not None:
        kwargs["input_ids"] = list(item.token_ids)
    return kwargs


def softmax(values: Sequence[float]) -> list[float]:
    """Probabilities of a logit vector (max-shifted, so large logits do not overflow)."""
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = math.fsum(weights)
    return [w / total for w in weights]


def classify_semantics(requested: Semantics | None) -> Semantics:
    """LOGITS (SGLang's output) unless probabilities were asked for."""
    return PROBABILITIES if requested == PROBABILITIES else LOGITS


def score_semantics(call: ScoreCall, raw: Semantics) -> tuple[Semantics, pb.ScoreNormalization.ValueType]:
    """Native scores: ``raw`` values (logits, log-likelihoods), or their softmax across the vector."""
    softmaxed = call.normalization == SOFTMAX or call.semantics == PROBABILITIES
    if softmaxed and call.semantics == raw:
        raise InvalidArgument("softmax normalization gives probabilities")
    if call.semantics not in (None, raw, PROBABILITIES):
        raise InvalidArgument(f"this model's native scores are {pb.TaskValueSemantics.Name(raw)}")
    return (PROBABILITIES, SOFTMAX) if softmaxed else (raw, NONE)


def dense(values: Sequence[float]) -> DenseTensor:
    """A vector as a ``DenseTensor``."""
    return DenseTensor(shape=[len(values)], values=values)


def vector(data: Any) -> list[float]:
    """An embedding or logit row as floats (SGLang hands lists, tensors or a bare score)."""
    values = data.tolist() if hasattr(data, "tolist") else data
    return [float(v) for v in values] if isinstance(values, list) else [float(values)]


class TaskRunner:
    """Runs task calls on a started ``Engine``; ``request_class`` is SGLang's ``EmbeddingReqInput``."""

    def __init__(
        self,
        engine: Any,
        state: EngineState,
        limits: EngineLimits,
        embedding_request: Callable[..., Any],
        generate_request: Callable[..., Any],
    ) -> None:
        self._engine = engine
        self._state = state
        self._limits = limits
        self._embedding = embedding_request
        self._generate = generate_request

    async def pool(self, context: TaskContext, items: Sequence[dict[str, Any]], rids: Sequence[str]) -> list[Any]:
        """Every item's result dictionary (``embedding``, ``meta_info``), in order."""
        shared = self._shared(context)
        return await self._run(self._embedding, [{**shared, **item} for item in items], rids)

    def _shared(self, context: TaskContext) -> dict[str, Any]:
        """The call's LoRA adapter and priority, as every one of its SGLang requests takes them."""
        shared: dict[str, Any] = {}
        if context.lora_name is not None:
            shared["lora_path"] = context.lora_name
        if context.priority is not None:
            shared["priority"] = sglang_priority(context.priority, self._limits)
        return shared

    async def _run(self, kind: Callable[..., Any], items: Sequence[dict[str, Any]], rids: Sequence[str]) -> list[Any]:
        """Each item as its own non-streamed SGLang request; their final results, in order.

        The items succeed or fail together: once one fails (or the call is cancelled), the others are
        aborted inside SGLang and awaited, so none runs on after the call's ids were forgotten.
        """
        manager = self._engine.tokenizer_manager
        running = [
            asyncio.ensure_future(self._one(kind(rid=rid, **item))) for rid, item in zip(rids, items, strict=True)
        ]
        try:
            return await asyncio.gather(*running)
        except BaseException:
            for rid, item in zip(rids, running, strict=True):
                if not item.done():
                    manager.abort_request(rid)
                    item.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    async def _one(self, request: Any) -> Any:
        """One SGLang request's final result; closing its generator ends SGLang's bookkeeping of it."""
        outputs = self._engine.tokenizer_manager.generate_request(request, None)
        try:
            return await outputs.__anext__()
        finally:
            await outputs.aclose()

    async def embed(self, call: EmbedCall, rids: Sequence[str]) -> tuple[list[Embedding], TaskUsage]:
        """Sequence embeddings of every item."""
        items = []
        for item in call.items:
            kwargs = item_kwargs(item)
            if call.dimensions is not None:
                kwargs["dimensions"] = call.dimensions
            items.append(kwargs)
        results = await self.pool(call.context, items, rids)
        outputs = [Embedding(SEQUENCE, dense(vector(r["embedding"]))) for r in results]
        return outputs, usage(results)

    async def classify(self, call: ClassifyCall, rids: Sequence[str]) -> tuple[list[Classification], TaskUsage]:
        """Class logits (or their softmax) of every item, with the model's labels."""
        semantics = classify_semantics(call.semantics)
        results = await self.pool(call.context, [item_kwargs(item) for item in call.items], rids)
        outputs = []
        for result in results:
            logits = vector(result["embedding"])
            scores = softmax(logits) if semantics == PROBABILITIES else logits
            labels = self._state.labels if len(self._state.labels) == len(scores) else ()
            outputs.append(Classification(SEQUENCE, semantics, dense(scores), labels))
        return outputs, usage(results)

    async def score(self, call: ScoreCall, rids: Sequence[str]) -> tuple[ScoreResult, TaskUsage]:
        """Label-token scores on a generation model, cross-encoder scores on a classifier."""
        if self._state.is_generation:
            if call.label_token_ids:
                return await self._label_scores(call)
            return await self._likelihoods(call, rids)
        semantics, normalization = score_semantics(call, LOGITS)
        # SGLang takes cross-encoder input only as a batch of [query, document] pairs with a rid
        # each (its rerank path); the batch's one result is the list of every pair's, in order.
        pairs = [[_text(group.query), _text(candidate)] for group in call.groups for candidate in group.candidates]
        batch = self._embedding(rid=list(rids), text=pairs, is_cross_encoder_request=True, **self._shared(call.context))
        results = iter(await self._engine.tokenizer_manager.generate_request(batch, None).__anext__())
        groups = []
        used = []
        for group in call.groups:
            scored = []
            for _ in group.candidates:
                result = next(results)
                used.append(result)
                logits = vector(result["embedding"])
                scored.append(CandidateScore(dense(softmax(logits) if normalization == SOFTMAX else logits)))
            groups.append(scored)
        return ScoreResult(SEQUENCE, semantics, normalization, groups, higher_is_better=True), usage(used)

    async def _likelihoods(self, call: ScoreCall, rids: Sequence[str]) -> tuple[ScoreResult, TaskUsage]:
        """Each candidate's log-likelihood after its query, from a prefill-only request's prompt logprobs.

        SGLang's first prompt entry has no logprob, so it starts one token before the candidate.
        """
        semantics, normalization = score_semantics(call, LOG_PROBABILITIES)
        tokenizer = self._engine.tokenizer_manager.tokenizer
        items = []
        for group in call.groups:
            query = _ids(group.query, tokenizer)
            if not query:
                raise InvalidArgument(f"group {group.group_id!r}: the query has no tokens")
            for candidate in group.candidates:
                items.append(
                    {
                        # The candidate continues the query: no second BOS between them.
                        "input_ids": query + _ids(candidate, tokenizer, special_tokens=False),
                        "sampling_params": {"max_new_tokens": 0},
                        "return_logprob": True,
                        "logprob_start_len": len(query) - 1,
                    }
                )
        results = iter(await self._run(self._generate, items, rids))
        groups = []
        used = []
        for group in call.groups:
            scored = []
            for _ in group.candidates:
                result = next(results)
                used.append(result)
                value = math.fsum(entry[0] for entry in result["meta_info"]["input_token_logprobs"][1:])
                scored.append(CandidateScore(dense(softmax([value]) if normalization == SOFTMAX else [value])))
            groups.append(scored)
        return ScoreResult(SEQUENCE, semantics, normalization, groups, higher_is_better=True), usage(used)

    async def _label_scores(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """``async_score`` per group: each label token's probability after query + candidate."""
        if call.semantics not in (None, PROBABILITIES):
            raise InvalidArgument("label-token scores are probabilities")
        check_label_tokens(call.label_token_ids, self._engine.tokenizer_manager.tokenizer)
        softmaxed = call.normalization == SOFTMAX
        groups = []
        prompt_tokens = 0
        for group in call.groups:
            query = _input(group.query)
            items = [_input(candidate) for candidate in group.candidates]
            if any(isinstance(item, str) != isinstance(query, str) for item in items):
                raise InvalidArgument(f"group {group.group_id!r}: SGLang scores text with text, token ids with ids")
            result = await self._engine.async_score(
                query=query, items=items, label_token_ids=list(call.label_token_ids), apply_softmax=softmaxed
            )
            groups.append([CandidateScore(dense(vector(row))) for row in result.scores])
            prompt_tokens += result.prompt_tokens
        normalization = SOFTMAX if softmaxed else NONE
        scores = ScoreResult(SEQUENCE, PROBABILITIES, normalization, groups, higher_is_better=True)
        return scores, TaskUsage(input_tokens=prompt_tokens)


def check_label_tokens(label_token_ids: Sequence[int], tokenizer: Any) -> None:
    """Refuse what SGLang's label-token scoring refuses after acceptance: an id from the tokenizer's
    ``vocab_size`` on (``TokenizerManagerScoreMixin.score_request``; added tokens past it included)."""
    vocab = getattr(tokenizer, "vocab_size", None)
    outside = [token_id for token_id in label_token_ids if vocab is not None and token_id >= vocab]
    if outside:
        raise InvalidArgument(
            f"label_token_ids {outside} are outside the tokenizer's vocabulary ({vocab} tokens), "
            "which SGLang's label-token scoring takes"
        )


def _text(item: TaskItem) -> str:
    if item.text is None:
        raise InvalidArgument("cross-encoder scoring takes text (SGLang tokenizes each query/candidate pair)")
    return item.text


def _ids(item: TaskItem, tokenizer: Any, *, special_tokens: bool = True) -> list[int]:
    if item.media:
        raise InvalidArgument("SGLang's causal-model scoring takes no media")
    if item.text is None:
        return list(item.token_ids or ())
    return tokenize(tokenizer, item.text, special_tokens=special_tokens)


def _input(item: TaskItem) -> str | list[int]:
    if item.media:
        raise InvalidArgument("SGLang's label-token scoring takes no media")
    return item.text if item.text is not None else list(item.token_ids or ())


def usage(results: Sequence[Any]) -> TaskUsage:
    """Input tokens over every item (SGLang reports no cache hits for pooled requests)."""
    return TaskUsage(input_tokens=sum(int(r["meta_info"].get("prompt_tokens") or 0) for r in results))


__all__ = [
    "TaskRunner",
    "check_label_tokens",
    "classify_semantics",
    "dense",
    "item_kwargs",
    "score_semantics",
    "softmax",
    "task_capabilities",
    "usage",
    "vector",
]
