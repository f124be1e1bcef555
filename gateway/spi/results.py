"""What a driver returns for Embed, Classify, Score, load and health: plain values, not wire messages.

The core checks these against the contract and encodes them (``core.results``), so a driver
never builds a protobuf message for them and this interface does not move with the wire
schema. Presence is kept: ``None`` is unknown (absent on the wire), ``0`` is a measured zero.
Enumerations (granularity, semantics, normalization, health state) are the protocol's own
values, as in the request types. Tensor values are any float sequence (a list from
``ndarray.tolist()`` is cheapest to encode); nothing here copies them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import pb


@dataclass(frozen=True, slots=True)
class DenseTensor:
    """Row-major values: ``shape`` ``[n]`` for a sequence output, ``[tokens, n]`` per token."""

    shape: Sequence[int]
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class SparseTensor:
    """The nonzero ``values`` at strictly increasing flat ``indices`` of a ``shape`` tensor."""

    shape: Sequence[int]
    indices: Sequence[int]
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class TaskUsage:
    """The prompt tokens a task call processed; ``cached_input_tokens`` ``None`` when unknown."""

    input_tokens: int
    cached_input_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Embedding:
    """One item's embedding; ``token_ids`` (token granularity only) align with its rows."""

    granularity: pb.TaskOutputGranularity.ValueType
    vector: DenseTensor | SparseTensor
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class Classification:
    """One item's class scores; ``labels`` name the last dimension's classes when known."""

    granularity: pb.TaskOutputGranularity.ValueType
    semantics: pb.TaskValueSemantics.ValueType
    scores: DenseTensor
    labels: Sequence[str] = ()
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """One candidate's scores (one value, or one per label token)."""

    scores: DenseTensor
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """Every group's candidate scores in request order, with the semantics actually produced.

    ``higher_is_better`` is ``None`` when the engine does not say.
    """

    granularity: pb.TaskOutputGranularity.ValueType
    semantics: pb.TaskValueSemantics.ValueType
    normalization: pb.ScoreNormalization.ValueType
    groups: Sequence[Sequence[CandidateScore]]
    higher_is_better: bool | None = None


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One data-parallel rank's load (the engine's own rank numbers); ``None`` is unknown."""

    data_parallel_rank: int | None = None
    running_requests: int | None = None
    queued_requests: int | None = None
    used_kv_blocks: int | None = None
    total_kv_blocks: int | None = None
    prefill_batch_size: int | None = None
    decode_batch_size: int | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """A point-in-time load snapshot; ``None`` is unknown, and ``Load()`` knows nothing.

    ``timestamp_unix_nanos`` is when the engine measured it (``None``: the gateway stamps the
    time it asked). The gateway fills in the instance id.
    """

    timestamp_unix_nanos: int | None = None
    running_requests: int | None = None
    queued_requests: int | None = None
    active_kv_sessions: int | None = None
    used_kv_blocks: int | None = None
    total_kv_blocks: int | None = None
    running_tokens: int | None = None
    waiting_tokens: int | None = None
    prefill_batch_size: int | None = None
    decode_batch_size: int | None = None
    ranks: Sequence[RankLoad] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """One named check (``scheduler``, ``model``, ``kv_connector``...) and its state."""

    name: str
    state: pb.HealthState.ValueType
    message: str = ""


__all__ = [
    "CandidateScore",
    "Classification",
    "DenseTensor",
    "Embedding",
    "HealthCheck",
    "Load",
    "RankLoad",
    "ScoreResult",
    "SparseTensor",
    "TaskUsage",
]
