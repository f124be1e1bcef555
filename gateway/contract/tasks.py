"""Embed, Classify and Score: request validation and response invariants.

Requests are checked against the contract and the model's advertised ``TaskCapabilities``
before any engine work; responses from a driver are checked before they reach the client
(one output per input in order, present zero-based indexes, well-formed finite tensors,
reported semantics), so a driver bug becomes an INTERNAL status rather than a response that
quietly breaks the contract.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Container, Iterable, Sequence
from typing import Literal, TypeVar

from google.protobuf.message import Message

from .. import pb
from ..errors import FailedPrecondition, InvalidArgument, clip, enum_name
from ..spi.requests import (
    ClassifyCall,
    EmbedCall,
    ScoreCall,
    ScoreGroupCall,
    TaskContext,
    TaskItem,
)
from .generation import parse_media
from .stream import ContractViolation

_TaskCaps = pb.EmbedCapabilities | pb.ClassifyCapabilities | pb.ScoreCapabilities
_Enum = TypeVar("_Enum", bound=int)


def task_capabilities(model: pb.ModelInfo, task: Literal["embed", "classify", "score"]) -> _TaskCaps:
    """The model's capability message for ``task`` ('embed', 'classify', 'score').

    Raises ``FailedPrecondition`` unless the model advertises the task as supported.
    """
    if model.HasField("tasks") and model.tasks.HasField(task):
        caps: _TaskCaps = getattr(model.tasks, task)
        if caps.HasField("supported") and caps.supported:
            return caps
    raise FailedPrecondition(f"model {model.served_model_name!r} does not support {task.capitalize()}")


def parse_context(context: pb.TaskRequestContext, caps: _TaskCaps) -> TaskContext:
    """The shared request context; lora and priority only where the task advertises them."""
    if context.lora_name and not (caps.HasField("supports_lora") and caps.supports_lora):
        raise InvalidArgument("this task does not advertise LoRA adapters (context.lora_name)")
    if context.HasField("priority") and not (caps.HasField("supports_priority") and caps.supports_priority):
        raise InvalidArgument("this task does not advertise priority (context.priority)")
    return TaskContext(
        request_id=context.request_id,
        model=context.model,
        lora_name=context.lora_name or None,
        priority=context.priority if context.HasField("priority") else None,
        metadata=dict(context.metadata),
    )


def require_context(context: pb.TaskRequestContext) -> None:
    """``request_id`` and ``model`` are required and non-empty."""
    if not context.request_id:
        raise InvalidArgument("context.request_id is required")
    if not context.model:
        raise InvalidArgument("context.model is required")


def _parse_item(
    item: pb.TaskInput, where: str, model: pb.ModelInfo, caps: _TaskCaps, *, require_id: bool = True
) -> TaskItem:
    if require_id and not item.item_id:
        raise InvalidArgument(f"{where}.item_id is required")
    which = item.WhichOneof("input")
    if which is None:
        raise InvalidArgument(f"{where} sets no input (text, token_ids or multimodal)")
    if which == "text":
        parsed = TaskItem(item.item_id, text=_text(item.text, where))
    elif which == "token_ids":
        parsed = TaskItem(item.item_id, token_ids=_ids(item.token_ids.ids, where))
    else:
        mm = item.multimodal
        if not mm.media:
            raise InvalidArgument(f"{where}.multimodal needs at least one media item")
        modalities = list(caps.modalities)
        media = parse_media(mm.media, _multimodal_model(model), modalities=modalities or None)
        prompt = mm.WhichOneof("prompt")
        parsed = TaskItem(
            item.item_id,
            text=_text(mm.text, where) if prompt == "text" else None,
            token_ids=_ids(mm.token_ids.ids, where) if prompt == "token_ids" else None,
            media=media,
        )
    types = list(caps.input_types)
    if types and parsed.input_type not in types:
        raise InvalidArgument(
            f"{where}: input type {pb.TaskInputType.Name(parsed.input_type)} is not advertised for this task"
        )
    return parsed


def _multimodal_model(model: pb.ModelInfo) -> pb.ModelInfo:
    """Task media is governed by the task's input types, not the generation flag."""
    allowed = pb.ModelInfo()
    allowed.CopyFrom(model)
    allowed.supports_multimodal = True
    return allowed


def _text(text: str, where: str) -> str:
    if not text:
        raise InvalidArgument(f"{where}.text must be non-empty")
    return text


def _ids(ids: Sequence[int], where: str) -> list[int]:
    if not ids:
        raise InvalidArgument(f"{where}.token_ids must be non-empty")
    return list(ids)


def _parse_batch(
    inputs: Sequence[pb.TaskInput], model: pb.ModelInfo, caps: pb.EmbedCapabilities | pb.ClassifyCapabilities
) -> tuple[TaskItem, ...]:
    if not inputs:
        raise InvalidArgument("inputs must be non-empty")
    limit = caps.max_batch_size if caps.HasField("max_batch_size") else None
    if limit is not None and len(inputs) > limit:
        raise InvalidArgument(f"{len(inputs)} inputs exceed the advertised max_batch_size ({limit})")
    items = tuple(_parse_item(item, f"inputs[{i}]", model, caps) for i, item in enumerate(inputs))
    _unique((item.item_id for item in items), "item_id", "the batch")
    return items


def _unique(ids: Iterable[str], field: str, scope: str) -> None:
    seen: set[str] = set()
    for value in ids:
        if value in seen:
            raise InvalidArgument(f"duplicate {field} {clip(value)} in {scope}")
        seen.add(value)


def _explicit(message: Message, field: str, advertised: Container[_Enum], what: str) -> _Enum | None:
    """An explicit enum option (UNSPECIFIED means default) that must be advertised."""
    if not message.HasField(field):
        return None
    value: _Enum = getattr(message, field)
    if value == 0:
        return None
    if value not in advertised:
        enum = message.DESCRIPTOR.fields_by_name[field].enum_type
        name = enum_name(enum, value) if enum is not None else str(value)
        raise InvalidArgument(f"{what} {name} is not advertised for this model")
    return value


def parse_embed(request: pb.EmbedRequest, model: pb.ModelInfo) -> EmbedCall:
    """Validate an ``EmbedRequest`` against the model's ``EmbedCapabilities``."""
    caps = task_capabilities(model, "embed")
    assert isinstance(caps, pb.EmbedCapabilities)
    context = parse_context(request.context, caps)
    items = _parse_batch(request.inputs, model, caps)
    options = request.options
    granularity = _explicit(options, "granularity", caps.granularities, "granularity")
    encoding = _explicit(options, "encoding", caps.encodings, "encoding")
    normalize = None
    if options.HasField("normalize"):
        if not (caps.HasField("supports_normalization") and caps.supports_normalization):
            raise InvalidArgument("this model does not advertise explicit normalization")
        normalize = options.normalize
    dimensions = None
    if options.HasField("dimensions"):
        dimensions = options.dimensions
        if dimensions == 0:
            raise InvalidArgument("options.dimensions must be greater than zero")
        if not (caps.HasField("supports_dimension_override") and caps.supports_dimension_override):
            raise InvalidArgument("this model does not advertise a dimensions override")
        if caps.HasField("dimension") and dimensions > caps.dimension:
            raise InvalidArgument(
                f"options.dimensions ({dimensions}) exceeds the native dimension ({caps.dimension}); "
                "it reduces, never pads"
            )
    return EmbedCall(context, items, granularity, normalize, dimensions, encoding)


def parse_classify(request: pb.ClassifyRequest, model: pb.ModelInfo) -> ClassifyCall:
    """Validate a ``ClassifyRequest`` against the model's ``ClassifyCapabilities``."""
    caps = task_capabilities(model, "classify")
    assert isinstance(caps, pb.ClassifyCapabilities)
    context = parse_context(request.context, caps)
    items = _parse_batch(request.inputs, model, caps)
    options = request.options
    granularity = _explicit(options, "granularity", caps.granularities, "granularity")
    semantics = _explicit(options, "output_semantics", caps.semantics, "output_semantics")
    return ClassifyCall(context, items, granularity, semantics)


def parse_score(request: pb.ScoreRequest, model: pb.ModelInfo) -> ScoreCall:
    """Validate a ``ScoreRequest`` against the model's ``ScoreCapabilities``."""
    caps = task_capabilities(model, "score")
    assert isinstance(caps, pb.ScoreCapabilities)
    context = parse_context(request.context, caps)
    if not request.groups:
        raise InvalidArgument("groups must be non-empty")
    if caps.HasField("max_groups") and len(request.groups) > caps.max_groups:
        raise InvalidArgument(f"{len(request.groups)} groups exceed the advertised max_groups ({caps.max_groups})")
    groups = []
    for g, group in enumerate(request.groups):
        where = f"groups[{g}]"
        if not group.group_id:
            raise InvalidArgument(f"{where}.group_id is required")
        if not group.HasField("query"):
            raise InvalidArgument(f"{where}.query is required")
        if not group.candidates:
            raise InvalidArgument(f"{where}.candidates must be non-empty")
        if caps.HasField("max_candidates_per_group") and len(group.candidates) > caps.max_candidates_per_group:
            raise InvalidArgument(
                f"{where} has {len(group.candidates)} candidates; the advertised maximum is "
                f"{caps.max_candidates_per_group}"
            )
        query = _parse_item(group.query, f"{where}.query", model, caps)
        candidates = tuple(
            _parse_item(c, f"{where}.candidates[{i}]", model, caps) for i, c in enumerate(group.candidates)
        )
        _unique([query.item_id, *(c.item_id for c in candidates)], "item_id", where)
        groups.append(ScoreGroupCall(group.group_id, query, candidates))
    _unique((g.group_id for g in groups), "group_id", "the request")
    options = request.options
    granularity = _explicit(options, "granularity", caps.granularities, "granularity")
    semantics = _explicit(options, "output_semantics", caps.semantics, "output_semantics")
    normalization = options.normalization
    if normalization not in (pb.SCORE_NORMALIZATION_UNSPECIFIED, *caps.normalizations):
        name = enum_name(pb.ScoreNormalization.DESCRIPTOR, normalization)
        raise InvalidArgument(f"normalization {name} is not advertised for this model")
    labels = tuple(options.label_token_ids)
    if labels:
        if len(set(labels)) != len(labels):
            raise InvalidArgument("options.label_token_ids has duplicates")
        if not (caps.HasField("supports_label_token_scoring") and caps.supports_label_token_scoring):
            raise InvalidArgument("this model does not advertise label-token scoring")
        if caps.HasField("max_label_token_ids") and len(labels) > caps.max_label_token_ids:
            raise InvalidArgument(
                f"{len(labels)} label_token_ids exceed the advertised maximum ({caps.max_label_token_ids})"
            )
    if options.instruction and not (caps.HasField("supports_instruction") and caps.supports_instruction):
        raise InvalidArgument("this model does not advertise score instructions")
    return ScoreCall(
        context,
        tuple(groups),
        granularity,
        semantics,
        normalization,
        labels,
        options.instruction,
    )


# -- response invariants -------------------------------------------------------------------


def check_dense(tensor: pb.DenseFloatTensor, where: str, limit: int | None = None) -> None:
    """Positive dimensions, shape product equals the value count, finite values."""
    shape = list(tensor.shape)
    if not shape or any(d == 0 for d in shape):
        raise ContractViolation(f"{where}: tensor shape {shape} must have positive dimensions")
    size = math.prod(shape)
    if size != len(tensor.values):
        raise ContractViolation(f"{where}: shape {shape} holds {size} values, got {len(tensor.values)}")
    if not all(map(math.isfinite, tensor.values)):
        raise ContractViolation(f"{where}: tensor values must be finite")
    if limit is not None and size > limit:
        raise ContractViolation(f"{where}: {size} values exceed the advertised limit {limit}")


def check_sparse(tensor: pb.SparseFloatTensor, where: str, limit: int | None = None) -> None:
    """Equal lengths, strictly increasing in-range indices, finite values."""
    shape = list(tensor.shape)
    if not shape or any(d == 0 for d in shape):
        raise ContractViolation(f"{where}: tensor shape {shape} must have positive dimensions")
    size = math.prod(shape)
    indices = list(tensor.indices)
    if len(indices) != len(tensor.values):
        raise ContractViolation(f"{where}: {len(indices)} indices for {len(tensor.values)} values")
    if any(b <= a for a, b in itertools.pairwise(indices)) or (indices and indices[-1] >= size):
        raise ContractViolation(f"{where}: indices must be strictly increasing and below {size}")
    if not all(map(math.isfinite, tensor.values)):
        raise ContractViolation(f"{where}: tensor values must be finite")
    if limit is not None and len(indices) > limit:
        raise ContractViolation(f"{where}: {len(indices)} values exceed the advertised limit {limit}")


def _check_granularity(granularity: int, shape: Sequence[int], token_ids: Sequence[int], where: str) -> None:
    if granularity == pb.TASK_OUTPUT_GRANULARITY_SEQUENCE and len(shape) != 1:
        raise ContractViolation(f"{where}: a sequence output has shape [n], got {list(shape)}")
    if granularity == pb.TASK_OUTPUT_GRANULARITY_TOKEN:
        if len(shape) != 2:
            raise ContractViolation(f"{where}: a token output has shape [tokens, n], got {list(shape)}")
        if token_ids and len(token_ids) != shape[0]:
            raise ContractViolation(f"{where}: {len(token_ids)} token_ids for {shape[0]} token rows")
    elif token_ids:
        raise ContractViolation(f"{where}: token_ids are returned only for token granularity")


def _check_requested(actual: int, requested: int | None, what: str, where: str) -> None:
    if actual == 0:
        raise ContractViolation(f"{where}: {what} must be reported")
    if requested is not None and actual != requested:
        raise ContractViolation(f"{where}: {what} {actual} differs from the requested {requested}")


def finish_embed(
    call: EmbedCall, outputs: Sequence[pb.EmbeddingOutput], usage: pb.TaskUsage, caps: pb.EmbedCapabilities
) -> pb.EmbedResponse:
    """Check the driver's outputs and assemble the response with ids and indexes."""
    _check_count(len(outputs), len(call.items))
    limit = caps.max_output_values_per_item if caps.HasField("max_output_values_per_item") else None
    response = pb.EmbedResponse(request_id=call.context.request_id)
    for index, (item, output) in enumerate(zip(call.items, outputs, strict=True)):
        where = f"outputs[{index}]"
        _check_requested(output.granularity, call.granularity, "granularity", where)
        kind = output.WhichOneof("embedding")
        if kind is None:
            raise ContractViolation(f"{where}: no embedding")
        if kind == "dense":
            check_dense(output.dense, where, limit)
            shape = list(output.dense.shape)
        else:
            check_sparse(output.sparse, where, limit)
            shape = list(output.sparse.shape)
        wanted_encoding = {pb.EMBEDDING_ENCODING_DENSE: "dense", pb.EMBEDDING_ENCODING_SPARSE: "sparse"}
        if call.encoding is not None and wanted_encoding[call.encoding] != kind:
            raise ContractViolation(f"{where}: {kind} embedding for a {wanted_encoding[call.encoding]} request")
        _check_granularity(output.granularity, shape, output.token_ids, where)
        if call.dimensions is not None and shape[-1] != call.dimensions:
            raise ContractViolation(f"{where}: dimension {shape[-1]} differs from the requested {call.dimensions}")
        added = response.outputs.add()
        added.CopyFrom(output)
        added.item_id = item.item_id
        added.input_index = index
    response.usage.CopyFrom(_checked_usage(usage))
    return response


def finish_classify(
    call: ClassifyCall,
    outputs: Sequence[pb.ClassificationOutput],
    usage: pb.TaskUsage,
    caps: pb.ClassifyCapabilities,
) -> pb.ClassifyResponse:
    """Check the driver's outputs and assemble the response with ids and indexes."""
    _check_count(len(outputs), len(call.items))
    limit = caps.max_output_values_per_item if caps.HasField("max_output_values_per_item") else None
    response = pb.ClassifyResponse(request_id=call.context.request_id)
    for index, (item, output) in enumerate(zip(call.items, outputs, strict=True)):
        where = f"outputs[{index}]"
        _check_requested(output.granularity, call.granularity, "granularity", where)
        _check_requested(output.semantics, call.semantics, "semantics", where)
        check_dense(output.scores, where, limit)
        _check_granularity(output.granularity, output.scores.shape, output.token_ids, where)
        if output.labels and len(output.labels) != output.scores.shape[-1]:
            raise ContractViolation(f"{where}: {len(output.labels)} labels for {output.scores.shape[-1]} classes")
        added = response.outputs.add()
        added.CopyFrom(output)
        added.item_id = item.item_id
        added.input_index = index
    response.usage.CopyFrom(_checked_usage(usage))
    return response


def finish_score(
    call: ScoreCall, result: pb.ScoreResponse, usage: pb.TaskUsage, caps: pb.ScoreCapabilities
) -> pb.ScoreResponse:
    """Check the driver's groups and candidates and stamp ids, indexes and label order."""
    _check_requested(result.granularity, call.granularity, "granularity", "response")
    _check_requested(result.semantics, call.semantics, "semantics", "response")
    requested_norm = call.normalization or None
    _check_requested(result.normalization, requested_norm, "normalization", "response")
    _check_count(len(result.groups), len(call.groups), "groups")
    limit = caps.max_output_values_per_candidate if caps.HasField("max_output_values_per_candidate") else None
    response = pb.ScoreResponse()
    response.CopyFrom(result)
    response.request_id = call.context.request_id
    del response.label_token_ids[:]
    response.label_token_ids.extend(call.label_token_ids)
    for g, (group_call, group) in enumerate(zip(call.groups, response.groups, strict=True)):
        _check_count(len(group.candidates), len(group_call.candidates), f"candidates of group {g}")
        group.group_id = group_call.group_id
        group.group_index = g
        for c, (candidate_call, candidate) in enumerate(zip(group_call.candidates, group.candidates, strict=True)):
            where = f"groups[{g}].candidates[{c}]"
            check_dense(candidate.scores, where, limit)
            _check_granularity(result.granularity, candidate.scores.shape, candidate.token_ids, where)
            if call.label_token_ids and candidate.scores.shape[-1] != len(call.label_token_ids):
                raise ContractViolation(f"{where}: scores do not align with the {len(call.label_token_ids)} labels")
            candidate.candidate_id = candidate_call.item_id
            candidate.candidate_index = c
    response.usage.CopyFrom(_checked_usage(usage))
    return response


def _check_count(actual: int, expected: int, what: str = "outputs") -> None:
    if actual != expected:
        raise ContractViolation(f"the engine returned {actual} {what} for {expected} inputs")


def _checked_usage(usage: pb.TaskUsage) -> pb.TaskUsage:
    if usage.HasField("cached_input_tokens") and usage.cached_input_tokens > usage.input_tokens:
        raise ContractViolation("cached_input_tokens exceeds input_tokens")
    return usage


__all__ = [
    "check_dense",
    "check_sparse",
    "finish_classify",
    "finish_embed",
    "finish_score",
    "parse_classify",
    "parse_context",
    "parse_embed",
    "parse_score",
    "require_context",
    "task_capabilities",
]
