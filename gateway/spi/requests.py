"""Validated, normalized requests: what a driver receives.

The gateway core parses every protobuf request once, enforces the contract and the target
model's advertised capabilities, resolves defaults that do not depend on the engine, and
hands drivers these frozen values. A driver therefore never re-reads proto3 presence bits
and never re-checks what the core already checked; it only maps to its native API.

Enum-typed fields hold ``openengine.v1`` enum values (``pb.GUIDED_DECODING_MODE_REGEX``...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import pb
from ..errors import InvalidArgument, clip


@dataclass(frozen=True, slots=True)
class CandidateSelection:
    """Which candidate tokens to report at each position besides the chosen one.

    ``mode`` is a ``CandidateTokenSelectionMode``: ``TOP_N`` uses ``top_n`` (possibly zero),
    ``TOKEN_IDS`` uses ``token_ids`` (non-empty, unique), ``ALL`` means the full vocabulary.
    """

    mode: pb.CandidateTokenSelectionMode.ValueType
    top_n: int = 0
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    """Report a logprob and rank per token, with ``candidates`` when selected."""

    candidates: CandidateSelection | None = None


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling knobs; ``None`` means the engine's default. ``top_k`` of 0 means no limit."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    num_sequences: int = 1

    KNOBS: ClassVar[tuple[str, ...]] = (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
    )
    """The knobs the in-tree engines take under these very names (seed and count differ per engine)."""

    def values(self, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The knobs the caller set, each unset one from ``defaults`` (a model's generation config) when there.

        Engines' own servers apply the model's defaults the same way; an engine called in process
        does not, so a driver passes them here.
        """
        defaults = defaults or {}
        values: dict[str, Any] = {}
        for name in self.KNOBS:
            value = getattr(self, name)
            if value is None:
                value = defaults.get(name)
            if value is not None:
                values[name] = value
        return values

    NEUTRAL: ClassVar[Mapping[str, float]] = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    """Each knob's value that leaves the model's distribution as it is (``seed`` has none)."""

    def require_neutral(self, *knobs: str, engine: str) -> None:
        """Refuse (``InvalidArgument``) a value of ``knobs`` (``KNOBS`` names, or ``seed``) that the
        engine does not implement, unless it is neutral: ModelInfo cannot advertise sampling knobs,
        so a knob an engine ignores would otherwise be silently ignored."""
        for name in knobs:
            value = getattr(self, name)
            if value is not None and value != self.NEUTRAL.get(name):
                neutral = f" (only {self.NEUTRAL[name]:g})" if name in self.NEUTRAL else ""
                raise InvalidArgument(f"sampling.{name}: {engine} does not implement it{neutral}, got {value}")


@dataclass(frozen=True, slots=True)
class Stopping:
    """When outputs end.

    ``max_tokens`` is ``None`` when the caller gave no limit: the driver then generates until
    the context is full (and no more than the model's advertised ``max_output_tokens``), never
    an engine's small built-in default. ``include_stop_in_output`` applies to caller stop
    strings and caller stop tokens alike; a model EOS token is never emitted as text.
    """

    max_tokens: int | None = None
    min_tokens: int = 0
    stop_texts: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_in_output: bool = False


@dataclass(frozen=True, slots=True)
class Guidance:
    """A structured-output constraint.

    ``mode`` is a ``GuidedDecodingMode``. ``spec`` is the JSON schema, regex, EBNF grammar or
    structural tag text; ``choices`` is set for CHOICE; JSON_OBJECT has neither. ``backend``
    is the caller's requested grammar backend, empty for the engine's default.
    """

    mode: pb.GuidedDecodingMode.ValueType
    spec: str = ""
    choices: tuple[str, ...] = ()
    backend: str = ""

    def require_backend(self, engine_backend: str | None, *, engine: str, setting: str) -> None:
        """Reject this guide unless ``engine_backend`` (the engine's ``setting``) can serve it.

        The in-tree engines pick their grammar backend once per engine, not per request: a
        guide needs one (without it some engines ignore guidance silently), and a request
        naming another backend would be served by a different one than it asked for.
        """
        if engine_backend is None:
            raise InvalidArgument(f"this {engine} engine was started without a {setting}")
        if self.backend and self.backend != engine_backend:
            raise InvalidArgument(
                f"guided.backend {clip(self.backend)} differs from this engine's {setting} {engine_backend!r}; "
                f"{engine} selects the backend per engine"
            )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A connectable KV-transfer endpoint."""

    host: str
    port: int
    protocol: str = ""


@dataclass(frozen=True, slots=True)
class KvSession:
    """A KV handoff reference: from a prefill engine's ``PrefillReady`` to a decode request.

    ``attributes`` holds the engine's transfer parameters with their JSON types preserved
    (``google.protobuf.Struct`` semantics: numbers are floats).
    """

    session_id: str
    transfer_backend: str = ""
    endpoints: tuple[Endpoint, ...] = ()
    dp_rank: int = 0
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Media:
    """One multimodal input; exactly one of ``url``, ``data_uri``, ``raw_bytes`` is set.

    ``modality`` is a ``Modality``; the core already turned UNSPECIFIED into IMAGE.
    """

    modality: pb.Modality.ValueType
    url: str | None = None
    data_uri: str | None = None
    raw_bytes: bytes | None = None
    mime_type: str = ""
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated ``GenerateRequest``.

    Exactly one of ``prompt`` and ``prompt_token_ids`` is set. ``priority`` follows the
    OpenEngine direction (larger runs first); a driver maps it to its engine's direction.
    ``kv_session`` is set exactly for decode requests; a PREFILL engine treats every request
    as a prefill.
    """

    request_id: str
    model: str
    prompt: str | None = None
    prompt_token_ids: Sequence[int] | None = None
    sampling: Sampling = Sampling()
    stopping: Stopping = Stopping()
    output_logprobs: LogprobRequest | None = None
    prompt_logprobs: LogprobRequest | None = None
    prompt_logprob_start: int = 0
    guidance: Guidance | None = None
    kv_session: KvSession | None = None
    data_parallel_rank: int | None = None
    bypass_prefix_cache: bool = False
    cache_salt: str | None = None
    media: tuple[Media, ...] = ()
    lora_name: str | None = None
    priority: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskItem:
    """One task input: text, token ids, or multimodal (media plus an optional prompt)."""

    item_id: str
    text: str | None = None
    token_ids: Sequence[int] | None = None
    media: tuple[Media, ...] = ()

    @property
    def input_type(self) -> pb.TaskInputType.ValueType:
        """The ``TaskInputType`` of this item."""
        if self.media:
            return pb.TASK_INPUT_TYPE_MULTIMODAL
        return pb.TASK_INPUT_TYPE_TEXT if self.text is not None else pb.TASK_INPUT_TYPE_TOKEN_IDS


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What every task request shares. ``priority`` follows the OpenEngine direction."""

    request_id: str
    model: str
    lora_name: str | None = None
    priority: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EmbedCall:
    """A validated ``EmbedRequest``; ``None`` options select the model default."""

    context: TaskContext
    items: tuple[TaskItem, ...]
    granularity: pb.TaskOutputGranularity.ValueType | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    encoding: pb.EmbeddingEncoding.ValueType | None = None


@dataclass(frozen=True, slots=True)
class ClassifyCall:
    """A validated ``ClassifyRequest``; ``None`` options select the model default."""

    context: TaskContext
    items: tuple[TaskItem, ...]
    granularity: pb.TaskOutputGranularity.ValueType | None = None
    semantics: pb.TaskValueSemantics.ValueType | None = None


@dataclass(frozen=True, slots=True)
class ScoreGroupCall:
    """One query and its candidates, in request order."""

    group_id: str
    query: TaskItem
    candidates: tuple[TaskItem, ...]


@dataclass(frozen=True, slots=True)
class ScoreCall:
    """A validated ``ScoreRequest``.

    ``normalization`` is ``SCORE_NORMALIZATION_UNSPECIFIED`` for the model default. A non-empty
    ``label_token_ids`` asks for causal-model label-token scoring; empty asks for the model's
    native scoring.
    """

    context: TaskContext
    groups: tuple[ScoreGroupCall, ...]
    granularity: pb.TaskOutputGranularity.ValueType | None = None
    semantics: pb.TaskValueSemantics.ValueType | None = None
    normalization: pb.ScoreNormalization.ValueType = pb.SCORE_NORMALIZATION_UNSPECIFIED
    label_token_ids: tuple[int, ...] = ()
    instruction: str = ""


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter as the gateway's registry knows it (``source_path`` already resolved)."""

    lora_id: int
    lora_name: str
    source_path: str


__all__ = [
    "CandidateSelection",
    "ClassifyCall",
    "EmbedCall",
    "Endpoint",
    "GenerationRequest",
    "Guidance",
    "KvSession",
    "LogprobRequest",
    "LoraAdapter",
    "Media",
    "Sampling",
    "ScoreCall",
    "ScoreGroupCall",
    "Stopping",
    "TaskContext",
    "TaskItem",
]
