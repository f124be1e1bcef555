"""Operator limits on what one request may carry, checked before anything else runs.

These caps come from the operator (``plugins.toml`` or flags), not from the model: a request
past one is not malformed, it is more than this gateway admits, so it is rejected with
RESOURCE_EXHAUSTED like gRPC's own message-size limit. No ``retry-after-ms`` hint goes
with it: the unchanged request would be refused again (concurrency limits, which a retry
can pass, carry the hint). Text is measured in characters, since the gateway does not
tokenize; token-id prompts in tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .. import pb
from ..errors import ResourceExhausted, clip


@dataclass(frozen=True)
class RequestLimits:
    """Per-request caps; None leaves a dimension to the engine's own limits."""

    max_prompt_chars: int | None = None
    """Characters of a text prompt (Generate, and each task input)."""
    max_prompt_tokens: int | None = None
    """Token ids of a token prompt (Generate, and each task input)."""
    max_task_items: int | None = None
    """Inputs of one Embed or Classify call; query and candidate inputs of one Score call."""


def advertise_task_limits(info: pb.ModelInfo, limits: RequestLimits) -> None:
    """Narrow a model's advertised batch limits to ``max_task_items``, so that discovery does not
    promise a batch the gateway refuses.

    Embed and Classify count inputs, so their ``max_batch_size`` is exact. A Score group holds a
    query and at least one candidate: ``max_groups`` (half the items) and
    ``max_candidates_per_group`` (all but the query) are each reachable alone; their product is
    not promised. With fewer than two items Score is left as the engine reports it.
    """
    items = limits.max_task_items
    if items is None or not info.HasField("tasks"):
        return
    tasks = info.tasks
    for caps in (tasks.embed, tasks.classify):
        if caps.supported:
            caps.max_batch_size = min(caps.max_batch_size, items) if caps.HasField("max_batch_size") else items
    score = tasks.score
    if score.supported and items >= 2:
        score.max_groups = min(score.max_groups, items // 2) if score.HasField("max_groups") else items // 2
        candidates = items - 1
        if score.HasField("max_candidates_per_group"):
            candidates = min(score.max_candidates_per_group, candidates)
        score.max_candidates_per_group = candidates


def check_generate(request: pb.GenerateRequest, limits: RequestLimits) -> None:
    """Raise RESOURCE_EXHAUSTED when the prompt exceeds the operator's caps."""
    kind = request.WhichOneof("input")
    if kind == "prompt":
        _check_chars(len(request.prompt), limits, "the prompt")
    elif kind == "token_ids":
        _check_tokens(len(request.token_ids.ids), limits, "the prompt")


def check_task_inputs(inputs: Iterable[pb.TaskInput], limits: RequestLimits) -> int:
    """Raise RESOURCE_EXHAUSTED when one input is too long; returns how many there are (``check_task_count``)."""
    count = 0
    for item in inputs:
        count += 1
        _check_input(item, limits, f"input {clip(item.item_id)}" if item.item_id else f"input {count - 1}")
    return count


def check_task_count(count: int, limits: RequestLimits) -> None:
    """Raise RESOURCE_EXHAUSTED when a call has more inputs than the gateway admits.

    Checked after what the model advertises: ``advertise_task_limits`` makes the cap the
    advertised batch limit, whose excess is INVALID_ARGUMENT; this catches what no advertised
    limit says (a Score's inputs in all).
    """
    if limits.max_task_items is not None and count > limits.max_task_items:
        raise ResourceExhausted(f"{count} task inputs exceed this gateway's limit of {limits.max_task_items}")


def score_inputs(request: pb.ScoreRequest) -> list[pb.TaskInput]:
    """Every query and candidate input of a Score call, in request order."""
    inputs: list[pb.TaskInput] = []
    for group in request.groups:
        if group.HasField("query"):
            inputs.append(group.query)
        inputs.extend(group.candidates)
    return inputs


def _check_input(item: pb.TaskInput, limits: RequestLimits, where: str) -> None:
    kind = item.WhichOneof("input")
    if kind == "text":
        _check_chars(len(item.text), limits, where)
    elif kind == "token_ids":
        _check_tokens(len(item.token_ids.ids), limits, where)
    elif kind == "multimodal":
        prompt = item.multimodal.WhichOneof("prompt")
        if prompt == "text":
            _check_chars(len(item.multimodal.text), limits, where)
        elif prompt == "token_ids":
            _check_tokens(len(item.multimodal.token_ids.ids), limits, where)


def _check_chars(length: int, limits: RequestLimits, where: str) -> None:
    if limits.max_prompt_chars is not None and length > limits.max_prompt_chars:
        raise ResourceExhausted(
            f"{where} has {length} characters; this gateway admits at most {limits.max_prompt_chars}"
        )


def _check_tokens(length: int, limits: RequestLimits, where: str) -> None:
    if limits.max_prompt_tokens is not None and length > limits.max_prompt_tokens:
        raise ResourceExhausted(
            f"{where} has {length} token ids; this gateway admits at most {limits.max_prompt_tokens}"
        )


__all__ = [
    "RequestLimits",
    "advertise_task_limits",
    "check_generate",
    "check_task_count",
    "check_task_inputs",
    "score_inputs",
]
