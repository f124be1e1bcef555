"""Embed, Classify and Score with deterministic outputs that honour every advertised option.

The task "model" is a seeded token-embedding table (plus a per-adapter delta) whose token
vectors are causally smoothed, so each position depends on what precedes it:

* Embed: dense sequence vectors are the mean of the token vectors, token vectors are the
  rows themselves; ``dimensions`` keeps the leading components (reduction, never padding),
  then ``normalize`` (default on for dense) scales each vector to unit length. Sparse
  vectors are lexical weights, the vocabulary hashed into the same native dimension (token
  id modulo the dimension), so the model has the one dimension it advertises (default not
  normalized).
* Classify: a seeded linear head over the same vectors gives logits, probabilities (softmax)
  or log-probabilities (log-softmax) for the configured labels, per sequence or per token.
* Score: natively, the cosine similarity of the query (after the instruction) and the
  candidate; with ``label_token_ids``, the pseudo-model's next-token log-probabilities of
  the labels after instruction + query + candidate, or their softmax over the label set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np
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
    SparseTensor,
    TaskItem,
    TaskUsage,
)

from .model import PseudoModel, bound
from .tokenizer import BOS, VOCAB_SIZE, encode, encode_input

_SEQUENCE = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE
_TOKEN = pb.TASK_OUTPUT_GRANULARITY_TOKEN


def _dense(array: np.ndarray) -> DenseTensor:
    return DenseTensor(shape=list(array.shape), values=array.astype(np.float32).ravel().tolist())


def _unit(array: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    unit: np.ndarray = array / np.where(norms == 0.0, 1.0, norms)
    return unit


def _log_softmax(array: np.ndarray) -> np.ndarray:
    shifted = array - array.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


class TaskModel:
    """Deterministic task outputs for one engine."""

    def __init__(
        self,
        seed: int,
        dimension: int,
        labels: Sequence[str],
        model: PseudoModel,
        max_context: int,
        pause: Callable[[int], float],
    ) -> None:
        rng = np.random.default_rng([seed, 0x7461736B])
        self._seed = seed
        self._dimension = dimension
        self._labels = list(labels)
        self._model = model
        self._max_context = max_context
        self._pause = pause
        self._embeddings = rng.normal(0.0, 1.0, (VOCAB_SIZE, dimension))
        self._head = rng.normal(0.0, dimension**-0.5, (dimension, len(labels)))
        self._lexical = rng.uniform(0.5, 1.5, VOCAB_SIZE)
        self._adapters: dict[int, np.ndarray] = {}

    def _table(self, lora_id: int) -> np.ndarray:
        """The embedding table with an adapter's delta mixed in (built once per loaded adapter)."""
        if lora_id == 0:
            return self._embeddings
        table = self._adapters.get(lora_id)
        if table is None:
            delta = np.random.default_rng([self._seed, lora_id, 0x6C6F7261]).normal(0.0, 0.5, self._embeddings.shape)
            table = self._adapters[lora_id] = self._embeddings + delta
            bound(self._adapters)
        return table

    def forget(self, lora_id: int) -> None:
        """Drop an unloaded adapter's table."""
        self._adapters.pop(lora_id, None)

    def tokens(self, item: TaskItem, *, bos: bool = True) -> list[int]:
        """An item's tokens (validated against the vocabulary and the context)."""
        tokens = encode_input(item.text, item.token_ids, item.media, bos=bos)
        if not tokens:
            raise InvalidArgument(f"item {item.item_id!r} has no tokens")
        if len(tokens) > self._max_context:
            raise InvalidArgument(f"item {item.item_id!r} has {len(tokens)} tokens; the context is {self._max_context}")
        return tokens

    def vectors(self, tokens: Sequence[int], lora_id: int) -> np.ndarray:
        """Causally smoothed token vectors, shape ``[len(tokens), dimension]``."""
        rows = self._table(lora_id)[list(tokens)]
        for position in range(1, len(rows)):
            rows[position] += 0.5 * rows[position - 1]
        return rows

    async def _yield(self, tokens: int) -> None:
        await asyncio.sleep(self._pause(tokens))

    # -- Embed ----------------------------------------------------------------------------

    async def embed(self, call: EmbedCall, lora_id: int) -> tuple[list[Embedding], TaskUsage]:
        """One embedding per item."""
        granularity = call.granularity or _SEQUENCE
        sparse = call.encoding == pb.EMBEDDING_ENCODING_SPARSE
        if sparse and call.dimensions is not None:
            raise InvalidArgument("options.dimensions reduces dense embeddings; it does not apply to sparse ones")
        normalize = call.normalize if call.normalize is not None else not sparse
        outputs, total = [], 0
        for item in call.items:
            tokens = self.tokens(item)
            total += len(tokens)
            await self._yield(len(tokens))
            vector: DenseTensor | SparseTensor
            if sparse:
                vector = self._sparse(tokens, granularity, normalize)
            else:
                vectors = self.vectors(tokens, lora_id)
                array = vectors.mean(axis=0) if granularity == _SEQUENCE else vectors
                array = array[..., : call.dimensions or self._dimension]
                vector = _dense(_unit(array) if normalize else array)
            outputs.append(Embedding(granularity, vector, token_ids=tokens if granularity == _TOKEN else ()))
        return outputs, TaskUsage(input_tokens=total)

    def _sparse(self, tokens: list[int], granularity: int, normalize: bool) -> SparseTensor:
        dimension = self._dimension
        if granularity == _TOKEN:
            indices = [position * dimension + token % dimension for position, token in enumerate(tokens)]
            values = self._lexical[tokens]
            shape = [len(tokens), dimension]
            if normalize:
                values = np.ones_like(values)  # each row has one nonzero value
        else:
            ids, counts = np.unique(tokens, return_counts=True)
            buckets, slots = np.unique(ids % dimension, return_inverse=True)
            values = np.zeros(len(buckets))
            np.add.at(values, slots, (1.0 + np.log(counts)) * self._lexical[ids])
            indices = buckets.tolist()
            shape = [dimension]
            if normalize:
                values = _unit(values)
        return SparseTensor(shape=shape, indices=indices, values=values.astype(np.float32).tolist())

    # -- Classify -------------------------------------------------------------------------

    async def classify(self, call: ClassifyCall, lora_id: int) -> tuple[list[Classification], TaskUsage]:
        """Class scores per item (or per token)."""
        granularity = call.granularity or _SEQUENCE
        semantics = call.semantics or pb.TASK_VALUE_SEMANTICS_LOGITS
        outputs, total = [], 0
        for item in call.items:
            tokens = self.tokens(item)
            total += len(tokens)
            await self._yield(len(tokens))
            vectors = self.vectors(tokens, lora_id)
            logits = (vectors.mean(axis=0) if granularity == _SEQUENCE else vectors) @ self._head
            if semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES:
                logits = np.exp(_log_softmax(logits))
            elif semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES:
                logits = _log_softmax(logits)
            token_ids = tokens if granularity == _TOKEN else ()
            outputs.append(Classification(granularity, semantics, _dense(logits), self._labels, token_ids))
        return outputs, TaskUsage(input_tokens=total)

    # -- Score ----------------------------------------------------------------------------

    async def score(self, call: ScoreCall, lora_id: int) -> tuple[ScoreResult, TaskUsage]:
        """Native similarity, or label-token scoring when label ids are given."""
        labels = list(call.label_token_ids)
        if labels:
            normalization = call.normalization or (
                pb.SCORE_NORMALIZATION_SOFTMAX
                if call.semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES
                else pb.SCORE_NORMALIZATION_NONE
            )
            semantics = (
                pb.TASK_VALUE_SEMANTICS_PROBABILITIES
                if normalization == pb.SCORE_NORMALIZATION_SOFTMAX
                else pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
            )
            bad = next((t for t in labels if t >= VOCAB_SIZE), None)
            if bad is not None:
                raise InvalidArgument(f"label token id {bad} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
        else:
            if call.normalization == pb.SCORE_NORMALIZATION_SOFTMAX:
                raise InvalidArgument("SOFTMAX normalizes label-token scores; native scores are single similarities")
            normalization, semantics = pb.SCORE_NORMALIZATION_NONE, pb.TASK_VALUE_SEMANTICS_SIMILARITY
        if call.semantics is not None and call.semantics != semantics:
            raise InvalidArgument(
                f"output_semantics {pb.TaskValueSemantics.Name(call.semantics)} does not fit this scoring "
                f"(it yields {pb.TaskValueSemantics.Name(semantics)})"
            )
        instruction = encode(call.instruction, bos=False)
        groups: list[list[CandidateScore]] = []
        total = 0
        for group in call.groups:
            query = [BOS, *instruction, *self.tokens(group.query, bos=False)]
            scored: list[CandidateScore] = []
            groups.append(scored)
            if not labels:
                total += len(query)
                query_vector = _unit(self.vectors(query, lora_id).mean(axis=0))
            for candidate in group.candidates:
                tokens = self.tokens(candidate, bos=False)
                await self._yield(len(tokens))
                if labels:
                    pair = [*query, *tokens]
                    total += len(pair)
                    values = self._label_scores(pair, labels, lora_id, normalization)
                else:
                    alone = [BOS, *tokens]
                    total += len(alone)
                    candidate_vector = _unit(self.vectors(alone, lora_id).mean(axis=0))
                    values = np.array([float(query_vector @ candidate_vector)])
                scored.append(CandidateScore(_dense(values)))
        result = ScoreResult(_SEQUENCE, semantics, normalization, groups, higher_is_better=True)
        return result, TaskUsage(input_tokens=total)

    def _label_scores(self, pair: list[int], labels: list[int], lora_id: int, normalization: int) -> np.ndarray:
        if len(pair) > self._max_context:
            raise InvalidArgument(
                f"a query + candidate pair has {len(pair)} tokens; the context is {self._max_context}"
            )
        row = self._model.row(pair, lora_id)
        logprobs: np.ndarray = self._model.tables.logprobs[row, labels]
        return np.exp(_log_softmax(logprobs)) if normalization == pb.SCORE_NORMALIZATION_SOFTMAX else logprobs


__all__ = ["TaskModel"]
