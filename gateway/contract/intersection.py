"""What a name served by several engines (a split) advertises: what every one of them accepts.

A request the split's ``ModelInfo`` admits must be valid on whichever engine the router picks,
so that table is the intersection of its engines': the smallest limit, a value only where all
agree, support only where all support it, the list entries all share. ``RULES`` gives the rule
of every field by its path; a test keeps it complete, so a new proto field fails until someone
decides its rule.

Token ids mean one thing per tokenizer. When the engines' tokenizers differ, everything that
takes token ids is withdrawn (``TOKEN_ID_CAPABILITIES``), and ``token_id_fields`` names what a
request sends of them, so the caller can refuse such a request with a message naming them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from .. import pb


class Rule(enum.Enum):
    """How the engines' values of one field become the split's."""

    CALLER = "left empty: the caller fills it in"
    SMALLEST = "the smallest value reported; absent when none is"
    CAPACITY = "the smallest value when every engine reports one; absent when any does not"
    COMMON = "the value every engine reports alike; absent (or empty) otherwise"
    ALL = "False when any engine reports False, True when all report True; absent (unknown) otherwise"
    SHARED = "the entries every engine lists, in the first engine's order"


RULES: Mapping[str, Rule] = {
    "model_id": Rule.COMMON,
    "served_model_name": Rule.CALLER,
    "served_model_aliases": Rule.CALLER,
    "max_context_length": Rule.SMALLEST,
    "max_output_tokens": Rule.SMALLEST,
    "kv_block_size": Rule.COMMON,
    "total_kv_blocks": Rule.CAPACITY,
    "max_running_requests": Rule.CAPACITY,
    "max_batched_tokens": Rule.CAPACITY,
    "tokenizer_modes": Rule.SHARED,
    "supports_text_input": Rule.ALL,
    "supports_token_ids_input": Rule.ALL,
    "generation.prompt_logprobs.supported": Rule.ALL,
    "generation.prompt_logprobs.candidate_selection_modes": Rule.SHARED,
    "generation.prompt_logprobs.max_top_n": Rule.SMALLEST,
    "generation.output_logprobs.supported": Rule.ALL,
    "generation.output_logprobs.candidate_selection_modes": Rule.SHARED,
    "generation.output_logprobs.max_top_n": Rule.SMALLEST,
    "generation.guided_decoding.supported": Rule.ALL,
    "generation.guided_decoding.modes": Rule.SHARED,
    "generation.max_num_sequences": Rule.SMALLEST,
    "generation.supports_priority": Rule.ALL,
    "generation.supports_stop_in_output": Rule.ALL,
    "generation.supports_cache_salt": Rule.ALL,
    "generation.supports_prefix_cache_bypass": Rule.ALL,
    "supports_lora": Rule.ALL,
    "supports_multimodal": Rule.ALL,
    "reasoning_parser": Rule.COMMON,
    "tool_call_parser": Rule.COMMON,
    "tasks.embed.supported": Rule.ALL,
    "tasks.embed.input_types": Rule.SHARED,
    "tasks.embed.granularities": Rule.SHARED,
    "tasks.embed.encodings": Rule.SHARED,
    "tasks.embed.dimension": Rule.COMMON,
    "tasks.embed.max_batch_size": Rule.SMALLEST,
    "tasks.embed.max_output_values_per_item": Rule.SMALLEST,
    "tasks.embed.supports_priority": Rule.ALL,
    "tasks.embed.supports_lora": Rule.ALL,
    "tasks.embed.supports_normalization": Rule.ALL,
    "tasks.embed.supports_dimension_override": Rule.ALL,
    "tasks.embed.modalities": Rule.SHARED,
    "tasks.classify.supported": Rule.ALL,
    "tasks.classify.input_types": Rule.SHARED,
    "tasks.classify.granularities": Rule.SHARED,
    "tasks.classify.semantics": Rule.SHARED,
    "tasks.classify.max_batch_size": Rule.SMALLEST,
    "tasks.classify.max_output_values_per_item": Rule.SMALLEST,
    "tasks.classify.supports_priority": Rule.ALL,
    "tasks.classify.supports_lora": Rule.ALL,
    "tasks.classify.modalities": Rule.SHARED,
    "tasks.score.supported": Rule.ALL,
    "tasks.score.input_types": Rule.SHARED,
    "tasks.score.granularities": Rule.SHARED,
    "tasks.score.semantics": Rule.SHARED,
    "tasks.score.normalizations": Rule.SHARED,
    "tasks.score.supports_label_token_scoring": Rule.ALL,
    "tasks.score.supports_instruction": Rule.ALL,
    "tasks.score.max_groups": Rule.SMALLEST,
    "tasks.score.max_candidates_per_group": Rule.SMALLEST,
    "tasks.score.max_output_values_per_candidate": Rule.SMALLEST,
    "tasks.score.supports_priority": Rule.ALL,
    "tasks.score.supports_lora": Rule.ALL,
    "tasks.score.higher_is_better": Rule.COMMON,
    "tasks.score.modalities": Rule.SHARED,
    "tasks.score.max_label_token_ids": Rule.SMALLEST,
}
"""The rule of every non-message field of ``ModelInfo``, by dotted path. A message field has no
rule: it is present when any engine's is, and its fields follow theirs, a missing one read as
every field unreported.

A limit the gateway enforces (``SMALLEST``) is the tightest any engine reports: what an engine
does not report it does not refuse for. A capacity (``CAPACITY``: KV blocks, running requests,
batched tokens) describes each engine, so the split reports one only when it can vouch for
every engine, like ``kv_block_size`` (``COMMON``)."""

TOKEN_ID_CAPABILITIES: Mapping[str, int | None] = {
    "supports_token_ids_input": None,
    "generation.prompt_logprobs.candidate_selection_modes": pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    "generation.output_logprobs.candidate_selection_modes": pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    "tasks.embed.input_types": pb.TASK_INPUT_TYPE_TOKEN_IDS,
    "tasks.classify.input_types": pb.TASK_INPUT_TYPE_TOKEN_IDS,
    "tasks.score.input_types": pb.TASK_INPUT_TYPE_TOKEN_IDS,
    "tasks.score.supports_label_token_scoring": None,
    "tasks.score.max_label_token_ids": None,
}
"""What only concerns token ids, withdrawn from a split whose engines' tokenizers differ: the
entry a list loses, or ``None`` for a field withdrawn whole (a bool becomes False, a limit absent).
A multimodal task input's token-id prompt has no capability of its own: ``token_id_fields``
names it in a request."""


def intersect_model_info(infos: Sequence[pb.ModelInfo], *, same_tokenizer: bool) -> pb.ModelInfo:
    """What every engine of ``infos`` accepts, as a new ``ModelInfo`` (served names left empty).

    With one input it is a copy of it. ``same_tokenizer`` False (two or more inputs) withdraws
    the ``TOKEN_ID_CAPABILITIES``.
    """
    if not infos:
        raise ValueError("intersect_model_info needs at least one ModelInfo")
    result = pb.ModelInfo()
    _intersect(result, list(infos), "")
    if not same_tokenizer and len(infos) > 1:
        for path, entry in TOKEN_ID_CAPABILITIES.items():
            _withdraw(result, path, entry)
    return result


def _intersect(target: Message, sources: Sequence[Message | None], prefix: str) -> None:
    """Fill ``target`` from ``sources`` (``None``: an engine without this submessage)."""
    for field in target.DESCRIPTOR.fields:
        name, path = field.name, prefix + field.name
        if field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            parts = [getattr(s, name) if s is not None and s.HasField(name) else None for s in sources]
            if any(part is not None for part in parts):
                child = getattr(target, name)
                child.SetInParent()
                _intersect(child, parts, f"{path}.")
            continue
        rule = RULES[path]
        if rule is Rule.SHARED:
            lists = [list(getattr(s, name)) if s is not None else [] for s in sources]
            getattr(target, name).extend(entry for entry in lists[0] if all(entry in other for other in lists[1:]))
        elif rule is not Rule.CALLER:
            merged = _merge(rule, [_reported(s, name, optional=field.has_presence) for s in sources])
            if merged is not None:
                setattr(target, name, merged)


def _merge(rule: Rule, values: Sequence[object]) -> object:
    """One field's value for the split (``None``: absent) from each engine's (``None``: unreported)."""
    reported = [value for value in values if value is not None]
    if rule is Rule.SMALLEST or (rule is Rule.CAPACITY and len(reported) == len(values)):
        return min(reported) if reported else None  # type: ignore[type-var]  # numbers, by RULES
    if rule is Rule.CAPACITY:
        return None
    if rule is Rule.COMMON:
        return values[0] if len(reported) == len(values) and all(v == values[0] for v in values) else None
    if False in reported:  # Rule.ALL
        return False
    return True if len(reported) == len(values) else None


def _reported(message: Message | None, name: str, *, optional: bool) -> object:
    """The field's value, or ``None`` when unreported (no submessage, or an optional left unset)."""
    if message is None or (optional and not message.HasField(name)):
        return None
    return getattr(message, name)


def _withdraw(info: pb.ModelInfo, path: str, entry: int | None) -> None:
    """Withdraw one token-id capability of ``info``; nothing when its submessage is absent."""
    *parents, name = path.split(".")
    message: Message = info
    for part in parents:
        if not message.HasField(part):
            return
        message = getattr(message, part)
    field = message.DESCRIPTOR.fields_by_name[name]
    if entry is not None:
        kept = [value for value in getattr(message, name) if value != entry]
        message.ClearField(name)
        getattr(message, name).extend(kept)
    elif field.type == FieldDescriptor.TYPE_BOOL:
        setattr(message, name, False)
    else:
        message.ClearField(name)


TokenRequest = pb.GenerateRequest | pb.EmbedRequest | pb.ClassifyRequest | pb.ScoreRequest


def token_id_fields(request: TokenRequest) -> list[str]:
    """The fields of ``request`` that are set and carry token ids, as dotted paths, in field order.

    A field carries token ids when it is a ``TokenIds`` message or its name ends in ``token_id``
    or ``token_ids`` (``stopping.conditions.stop_token_id``, ``options.label_token_ids``); each
    path is named once however many items set it. Empty: nothing in the request depends on the
    tokenizer's ids.
    """
    found: dict[str, None] = {}
    _collect(request, "", found)
    return list(found)


def _collect(message: Message, prefix: str, found: dict[str, None]) -> None:
    for field, value in message.ListFields():
        path = prefix + field.name
        if _carries_token_ids(field):
            found[path] = None
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if field.is_repeated else (value,):
                _collect(item, f"{path}.", found)


def _carries_token_ids(field: FieldDescriptor) -> bool:
    if field.message_type is not None:
        return field.message_type.full_name == pb.TokenIds.DESCRIPTOR.full_name
    return field.name.endswith(("token_id", "token_ids"))


__all__ = ["RULES", "TOKEN_ID_CAPABILITIES", "Rule", "TokenRequest", "intersect_model_info", "token_id_fields"]
