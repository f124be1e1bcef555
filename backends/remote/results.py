"""The remote's task, load and health answers → SPI values: pure functions, no I/O.

Every value the remote sent survives, presence included (an absent field is ``None``), so the
front gateway encodes the same messages again. Tensor values are the received containers,
not copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from google.protobuf.message import Message
from openengine_gateway import pb
from openengine_gateway.errors import Internal
from openengine_gateway.spi import (
    CandidateScore,
    Classification,
    DenseTensor,
    Embedding,
    HealthCheck,
    Load,
    RankLoad,
    ScoreResult,
    SparseTensor,
    TaskUsage,
)

_LOAD_SCALARS = tuple(f.name for f in fields(Load) if f.name not in ("ranks", "attributes"))
"""The optional numbers of a load snapshot: the SPI value's own fields, as the core encodes them."""
_RANK_SCALARS = tuple(f.name for f in fields(RankLoad))


def dense(tensor: pb.DenseFloatTensor) -> DenseTensor:
    """A received dense tensor."""
    return DenseTensor(shape=tensor.shape, values=tensor.values)


def usage(message: pb.TaskUsage) -> TaskUsage:
    """The remote's task usage; unknown cached tokens stay unknown."""
    cached = message.cached_input_tokens if message.HasField("cached_input_tokens") else None
    return TaskUsage(message.input_tokens, cached)


def embeddings(outputs: Sequence[pb.EmbeddingOutput]) -> list[Embedding]:
    """The remote's embeddings, in order; one without a vector is a malformed result."""
    results = []
    for index, output in enumerate(outputs):
        vector: DenseTensor | SparseTensor
        kind = output.WhichOneof("embedding")
        if kind == "dense":
            vector = dense(output.dense)
        elif kind == "sparse":
            vector = SparseTensor(shape=output.sparse.shape, indices=output.sparse.indices, values=output.sparse.values)
        else:
            raise Internal(f"the engine returned a malformed result: outputs[{index}]: no embedding")
        results.append(Embedding(output.granularity, vector, token_ids=output.token_ids))
    return results


def classifications(outputs: Sequence[pb.ClassificationOutput]) -> list[Classification]:
    """The remote's classifications, in order."""
    return [
        Classification(output.granularity, output.semantics, dense(output.scores), output.labels, output.token_ids)
        for output in outputs
    ]


def score_result(response: pb.ScoreResponse) -> ScoreResult:
    """The remote's groups and candidates with the semantics it reported."""
    groups = [
        [CandidateScore(dense(candidate.scores), candidate.token_ids) for candidate in group.candidates]
        for group in response.groups
    ]
    higher = response.higher_is_better if response.HasField("higher_is_better") else None
    return ScoreResult(response.granularity, response.semantics, response.normalization, groups, higher)


def load(message: pb.LoadInfo) -> Load:
    """The remote's load snapshot (its instance id is the front's to set)."""
    ranks = [RankLoad(**_present(rank, _RANK_SCALARS)) for rank in message.ranks]
    return Load(**_present(message, _LOAD_SCALARS), ranks=ranks, attributes=dict(message.attributes))


def _present(message: Message, names: Sequence[str]) -> dict[str, int]:
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def health_checks(checks: Sequence[pb.HealthCheck]) -> list[HealthCheck]:
    """The remote's checks as they are."""
    return [HealthCheck(check.name, check.state, check.message) for check in checks]


__all__ = ["classifications", "dense", "embeddings", "health_checks", "load", "score_result", "usage"]
