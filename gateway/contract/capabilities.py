"""Checks on what a driver advertises, applied once when its engine starts.

The advertised ``ModelInfo`` is the table both discovery returns and validation enforces;
these checks make sure the table itself obeys the contract: capability lists never contain
UNSPECIFIED, reported limits and dimensions are greater than zero, and modalities appear only
where multimodal input is advertised. A driver that breaks them fails at start-up with a
message naming the field, instead of misleading clients later.
"""

from __future__ import annotations

from google.protobuf.message import Message

from .. import pb
from ..errors import CapabilityError

MODEL_LIMITS = (
    "max_context_length",
    "max_output_tokens",
    "kv_block_size",
    "total_kv_blocks",
    "max_running_requests",
    "max_batched_tokens",
)
TASK_LIMITS = (
    "dimension",
    "max_batch_size",
    "max_output_values_per_item",
    "max_groups",
    "max_candidates_per_group",
    "max_output_values_per_candidate",
    "max_label_token_ids",
)
TASK_LISTS = ("input_types", "granularities", "encodings", "semantics", "normalizations", "modalities")
"""The ``ModelInfo`` limits, the task capabilities' limits (positive when present) and their enum lists."""


def check_model_info(info: pb.ModelInfo) -> None:
    """Raise ``CapabilityError`` naming the first field that breaks a discovery rule."""
    for name in MODEL_LIMITS:
        _positive(info, name, "ModelInfo")
    generation = info.generation
    for side in ("prompt_logprobs", "output_logprobs"):
        caps = getattr(generation, side)
        _no_unspecified(caps.candidate_selection_modes, f"generation.{side}.candidate_selection_modes")
        _positive(caps, "max_top_n", f"generation.{side}")
    _no_unspecified(generation.guided_decoding.modes, "generation.guided_decoding.modes")
    _positive(generation, "max_num_sequences", "generation")
    for task in ("embed", "classify", "score"):
        caps = getattr(info.tasks, task)
        for name in TASK_LISTS:
            if hasattr(caps, name):
                _no_unspecified(getattr(caps, name), f"tasks.{task}.{name}")
        for name in TASK_LIMITS:
            if _has_field(caps, name):
                _positive(caps, name, f"tasks.{task}")
        if caps.modalities and pb.TASK_INPUT_TYPE_MULTIMODAL not in caps.input_types:
            raise CapabilityError(f"tasks.{task}.modalities is set without TASK_INPUT_TYPE_MULTIMODAL input")


def _has_field(message: Message, name: str) -> bool:
    return name in message.DESCRIPTOR.fields_by_name and message.HasField(name)


def _positive(message: Message, name: str, where: str) -> None:
    if message.HasField(name) and getattr(message, name) <= 0:
        raise CapabilityError(f"{where}.{name} is reported as {getattr(message, name)}; limits must be > 0")


def _no_unspecified(values: object, where: str) -> None:
    if 0 in values:  # type: ignore[operator]
        raise CapabilityError(f"{where} must not contain UNSPECIFIED")


__all__ = ["MODEL_LIMITS", "TASK_LIMITS", "TASK_LISTS", "check_model_info"]
