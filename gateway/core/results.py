"""The one place the core encodes what drivers return for tasks, load and health as wire messages.

A value of ``None`` in the SPI types (``spi.results``) is an absent field here, so presence
(absent = unknown, present 0 = a value) survives the encoding exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import pb
from ..spi.results import (
    CandidateScore,
    Classification,
    DenseTensor,
    Embedding,
    HealthCheck,
    Load,
    RankLoad,
    ScoreResult,
    TaskUsage,
)
from ..spi.wire import LOAD_SCALARS, RANK_SCALARS


def dense_message(tensor: DenseTensor) -> pb.DenseFloatTensor:
    """A dense tensor as its message."""
    return pb.DenseFloatTensor(shape=tensor.shape, values=tensor.values)


def embedding_message(embedding: Embedding) -> pb.EmbeddingOutput:
    """One embedding, ids and indexes left for the contract to stamp."""
    vector = embedding.vector
    output = pb.EmbeddingOutput(granularity=embedding.granularity, token_ids=embedding.token_ids)
    if isinstance(vector, DenseTensor):
        output.dense.CopyFrom(dense_message(vector))
    else:
        output.sparse.CopyFrom(pb.SparseFloatTensor(shape=vector.shape, indices=vector.indices, values=vector.values))
    return output


def classification_message(classification: Classification) -> pb.ClassificationOutput:
    """One classification, ids and indexes left for the contract to stamp."""
    return pb.ClassificationOutput(
        granularity=classification.granularity,
        semantics=classification.semantics,
        scores=dense_message(classification.scores),
        labels=classification.labels,
        token_ids=classification.token_ids,
    )


def score_message(result: ScoreResult) -> pb.ScoreResponse:
    """Every group's candidates; ids, indexes, label order and usage left for the contract."""
    response = pb.ScoreResponse(
        granularity=result.granularity, semantics=result.semantics, normalization=result.normalization
    )
    if result.higher_is_better is not None:
        response.higher_is_better = result.higher_is_better
    for group in result.groups:
        response.groups.add().candidates.extend(map(_candidate_message, group))
    return response


def _candidate_message(candidate: CandidateScore) -> pb.ScoreCandidateOutput:
    return pb.ScoreCandidateOutput(scores=dense_message(candidate.scores), token_ids=candidate.token_ids)


def usage_message(usage: TaskUsage) -> pb.TaskUsage:
    """Task usage; unknown cached tokens stay absent."""
    return pb.TaskUsage(input_tokens=usage.input_tokens, cached_input_tokens=usage.cached_input_tokens)


def embed_messages(result: tuple[Sequence[Embedding], TaskUsage]) -> tuple[list[pb.EmbeddingOutput], pb.TaskUsage]:
    """A driver's ``embed`` result as messages."""
    outputs, usage = result
    return [embedding_message(output) for output in outputs], usage_message(usage)


def classify_messages(
    result: tuple[Sequence[Classification], TaskUsage],
) -> tuple[list[pb.ClassificationOutput], pb.TaskUsage]:
    """A driver's ``classify`` result as messages."""
    outputs, usage = result
    return [classification_message(output) for output in outputs], usage_message(usage)


def score_messages(result: tuple[ScoreResult, TaskUsage]) -> tuple[pb.ScoreResponse, pb.TaskUsage]:
    """A driver's ``score`` result as messages."""
    scores, usage = result
    return score_message(scores), usage_message(usage)


def load_message(load: Load) -> pb.LoadInfo:
    """A driver's load snapshot; the instance id is the caller's to fill in."""
    message = pb.LoadInfo(**_present(load, LOAD_SCALARS), attributes=load.attributes)
    message.ranks.extend(pb.RankLoadInfo(**_present(rank, RANK_SCALARS)) for rank in load.ranks)
    return message


def _present(value: Load | RankLoad, names: Sequence[str]) -> dict[str, Any]:
    return {name: field for name in names if (field := getattr(value, name)) is not None}


def health_message(check: HealthCheck, prefix: str = "") -> pb.HealthCheck:
    """One check, its message after ``prefix`` (which names the engine behind a shared endpoint)."""
    return pb.HealthCheck(name=check.name, state=check.state, message=prefix + check.message)


__all__ = [
    "classification_message",
    "classify_messages",
    "dense_message",
    "embed_messages",
    "embedding_message",
    "health_message",
    "load_message",
    "score_message",
    "score_messages",
    "usage_message",
]
