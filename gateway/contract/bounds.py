"""Bounds on every field whose size the client chooses, checked before anything else reads it.

A field past its bound is malformed for this gateway, not merely too much: the answer is
INVALID_ARGUMENT (the operator's caps on prompts and batches, ``limits``, are RESOURCE_EXHAUSTED).
Defaults are generous for real use and each is settable; without them a client can make every
stream repeat a 100 kB request id, or spend seconds of a core matching 90,000 stop strings.
Only counts and lengths are compared here, so a check costs nothing next to the parse that
already happened.

``num_sequences`` is bounded through discovery instead: ``advertise_bounds`` narrows each
model's advertised ``max_num_sequences``, which Generate then enforces, so a client never
discovers a count that Generate refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import pb
from ..errors import InvalidArgument


@dataclass(frozen=True)
class FieldBounds:
    """The largest client-sized values this gateway accepts."""

    max_id_chars: int = 1024
    """Characters of an identifier: request_id, KV session ids, lora_name, cache_salt, task
    item_id and group_id, and each key and value of a request's metadata."""
    max_stop_conditions: int = 1024
    """Stop strings and stop token ids of one Generate."""
    max_stop_chars: int = 4096
    """Characters of one stop string."""
    max_guide_chars: int = 1024 * 1024
    """Characters of a guided-decoding spec (JSON schema, regex, grammar, structural tag), or
    of all the choices of a choice constraint together."""
    max_candidate_ids: int = 4096
    """Token ids of an explicit candidate selection (``response.*_candidates.token_ids``), the
    contract's nearest thing to a logit-bias map."""
    max_num_sequences: int = 128
    """Sequences of one Generate (``sampling.num_sequences``), through the advertised maximum."""
    max_metadata_entries: int = 64
    """Entries of a request's ``metadata`` map."""
    max_path_chars: int = 4096
    """Characters of a LoRA adapter's ``source_path``."""


DEFAULT_BOUNDS = FieldBounds()


def advertise_bounds(info: pb.ModelInfo, bounds: FieldBounds) -> None:
    """Narrow a generating model's advertised ``max_num_sequences`` to the gateway's bound."""
    if not info.HasField("generation"):
        return
    caps = info.generation
    limit = bounds.max_num_sequences
    caps.max_num_sequences = min(caps.max_num_sequences, limit) if caps.HasField("max_num_sequences") else limit


def check_generate_fields(request: pb.GenerateRequest, bounds: FieldBounds) -> None:
    """Raise INVALID_ARGUMENT when a client-sized field of a Generate is past its bound."""
    _id(request.request_id, "request_id", bounds)
    _id(request.lora_name, "lora_name", bounds)
    _id(request.kv.session.session_id, "kv.session.session_id", bounds)
    _id(request.kv.cache_salt, "kv.cache_salt", bounds)
    _metadata(request.metadata, bounds)
    conditions = request.stopping.conditions
    _count(len(conditions), bounds.max_stop_conditions, "stopping.conditions", "max-stop-conditions")
    for position, condition in enumerate(conditions):
        _chars(condition.stop_text, bounds.max_stop_chars, f"stopping.conditions[{position}].stop_text", "stop")
    response = request.response
    for side in ("prompt", "output"):
        selection: pb.CandidateTokenSelection = getattr(response, f"{side}_candidates")
        _count(
            len(selection.token_ids.ids),
            bounds.max_candidate_ids,
            f"response.{side}_candidates.token_ids",
            "max-candidate-ids",
        )
    guided = request.guided
    kind = guided.WhichOneof("guide")
    _id(guided.backend, "guided.backend", bounds)
    if kind == "choice":
        _chars_total(guided.choice.choices, bounds.max_guide_chars, "guided.choice.choices")
    elif kind is not None and kind != "json_object":
        _chars(getattr(guided, kind), bounds.max_guide_chars, f"guided.{kind}", "guide")


def check_task_fields(request: pb.EmbedRequest | pb.ClassifyRequest | pb.ScoreRequest, bounds: FieldBounds) -> None:
    """Raise INVALID_ARGUMENT when an identifier or the metadata of a task call is past its bound."""
    context = request.context
    _id(context.request_id, "context.request_id", bounds)
    _id(context.lora_name, "context.lora_name", bounds)
    _metadata(context.metadata, bounds)
    if isinstance(request, pb.ScoreRequest):
        for position, group in enumerate(request.groups):
            _id(group.group_id, f"groups[{position}].group_id", bounds)
            _id(group.query.item_id, f"groups[{position}].query.item_id", bounds)
            _ids((item.item_id for item in group.candidates), f"groups[{position}].candidates", bounds)
    else:
        _ids((item.item_id for item in request.inputs), "inputs", bounds)


def check_abort_fields(request: pb.AbortRequest, bounds: FieldBounds) -> None:
    """Raise INVALID_ARGUMENT when an Abort's request or session id is past its bound."""
    _id(request.request_id, "request_id", bounds)
    _id(request.kv_session.session_id, "kv_session.session_id", bounds)


def check_lora_fields(adapter_name: str, source_path: str, bounds: FieldBounds) -> None:
    """Raise INVALID_ARGUMENT when a LoRA call's name or path is past its bound."""
    _id(adapter_name, "lora_name", bounds)
    _chars(source_path, bounds.max_path_chars, "adapter.source_path", "path")


def _id(value: str, field: str, bounds: FieldBounds) -> None:
    _chars(value, bounds.max_id_chars, field, "id")


def _ids(values: Iterable[str], where: str, bounds: FieldBounds) -> None:
    for position, value in enumerate(values):
        _id(value, f"{where}[{position}].item_id", bounds)


def _metadata(metadata: Mapping[str, str], bounds: FieldBounds) -> None:
    _count(len(metadata), bounds.max_metadata_entries, "metadata", "max-metadata-entries")
    for position, (key, value) in enumerate(metadata.items()):
        _chars(key, bounds.max_id_chars, f"metadata key {position}", "id")
        _chars(value, bounds.max_id_chars, f"metadata value {position}", "id")


def _chars(value: str, limit: int, field: str, flag: str) -> None:
    if len(value) > limit:
        raise InvalidArgument(
            f"{field} has {len(value)} characters; this gateway accepts at most {limit} (--max-{flag}-chars)"
        )


def _chars_total(values: Iterable[str], limit: int, field: str) -> None:
    total = sum(len(value) for value in values)
    if total > limit:
        raise InvalidArgument(
            f"{field} have {total} characters in all; this gateway accepts at most {limit} (--max-guide-chars)"
        )


def _count(count: int, limit: int, field: str, flag: str) -> None:
    if count > limit:
        raise InvalidArgument(f"{field} has {count} entries; this gateway accepts at most {limit} (--{flag})")


__all__ = [
    "DEFAULT_BOUNDS",
    "FieldBounds",
    "advertise_bounds",
    "check_abort_fields",
    "check_generate_fields",
    "check_lora_fields",
    "check_task_fields",
]
