"""Rules shared by Embed, Classify and Score: support, routing, the request context, batches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Iterable, Sized
from typing import Any

import grpc

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import advertised, denied, present
from .abort import abort_request, still_running

SECTION = "Non-generative task API"
TASKS = ("embed", "classify", "score")
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def task_caps(target: Target, task: str) -> Any:
    """The task's capability message when the model advertises the task as supported, else None."""
    info = target.model_info
    if present(info, "tasks") and present(info.tasks, task) and advertised(getattr(info.tasks, task), "supported"):
        return getattr(info.tasks, task)
    return None


def reported_unsupported(target: Target, task: str) -> bool:
    """The model says it does not support ``task``: no ``tasks`` at all, or ``supported = false``."""
    info = target.model_info
    if not present(info, "tasks"):
        return True
    return (
        present(info.tasks, task)
        and present(getattr(info.tasks, task), "supported")
        and task_caps(target, task) is None
    )


def require_task(target: Target, task: str) -> Any:
    """The task's capabilities (``NotApplicable`` unless supported)."""
    caps = task_caps(target, task)
    target.require(caps is not None, f"{task.capitalize()} support")
    return caps


def context(target: Target, **fields: Any) -> pb.TaskRequestContext:
    """A fresh request context for the target's model."""
    return pb.TaskRequestContext(**{"request_id": target.request_id("task"), "model": target.model, **fields})


def item(target: Target, caps: Any, item_id: str, text: str = "conformance") -> pb.TaskInput:
    """An input of a type the task advertises (text when it may, else token ids)."""
    types = list(caps.input_types)
    if not types or pb.TASK_INPUT_TYPE_TEXT in types:
        return pb.TaskInput(item_id=item_id, text=text)
    return pb.TaskInput(item_id=item_id, token_ids=pb.TokenIds(ids=[1 + len(text) % 7, 2, 3, 4]))


def build(target: Target, task: str, caps: Any, inputs: list[pb.TaskInput] | None = None, **ctx: Any) -> Any:
    """A valid request of ``task`` (Score: one group), with ``inputs`` in place of the defaults."""
    if inputs is None:
        inputs = [item(target, caps, "first", "alpha"), item(target, caps, "second", "beta")]
    if task == "score":
        return pb.ScoreRequest(
            context=context(target, **ctx),
            groups=[pb.ScoreGroup(group_id="g", query=inputs[0], candidates=inputs[1:] or inputs)],
        )
    message = pb.EmbedRequest if task == "embed" else pb.ClassifyRequest
    return message(context=context(target, **ctx), inputs=inputs)


def unadvertised(values: Iterable[int], advertised: Container[int] | Sized) -> list[int]:
    """Non-UNSPECIFIED ``values`` missing from a reported list (none when the list is empty: unreported)."""
    if not len(advertised):  # type: ignore[arg-type]
        return []
    return [v for v in values if v and v not in advertised]  # type: ignore[operator]


def call(target: Target, task: str) -> Callable[[Any], Awaitable[Any]]:
    """The client method of ``task``."""
    method: Callable[[Any], Awaitable[Any]] = getattr(target.client, task)
    return method


async def each_supported(target: Target, check: Callable[[str, Any], Awaitable[None]]) -> None:
    """Run ``check`` for every task the model supports (``NotApplicable`` when it supports none)."""
    supported = [(task, caps) for task in TASKS if (caps := task_caps(target, task)) is not None]
    target.require(bool(supported), "any of Embed, Classify or Score")
    for task, caps in supported:
        await check(task, caps)


@rule(
    "tasks.unsupported-failed-precondition",
    SECTION,
    "The server rejects an unsupported task with FAILED_PRECONDITION. An absent ModelInfo.tasks means the model "
    "does not advertise non-generative task support.",
)
async def unsupported(target: Target) -> None:
    unsupported = [task for task in TASKS if reported_unsupported(target, task)]
    target.require(bool(unsupported), "a task it does not support")
    for task in unsupported:
        request = build(target, task, pb.EmbedCapabilities())
        await target.expect_status(
            call(target, task)(request), grpc.StatusCode.FAILED_PRECONDITION, what=f"unsupported {task}"
        )


@rule(
    "tasks.unknown-model",
    SECTION,
    "The server rejects ... an unknown model with NOT_FOUND.",
)
async def unknown_model(target: Target) -> None:
    for task in TASKS:
        request = build(target, task, task_caps(target, task) or pb.EmbedCapabilities())
        request.context.model = "conformance-no-such-model"
        await target.expect_status(
            call(target, task)(request), grpc.StatusCode.NOT_FOUND, what=f"{task}: unknown model"
        )


@rule(
    "tasks.context-required",
    SECTION,
    "TaskRequestContext.request_id and model are required and non-empty.",
)
async def context_required(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        for missing in ("request_id", "model"):
            request = build(target, task, caps)
            request.context.ClearField(missing)
            await target.expect_status(call(target, task)(request), _INVALID, what=f"{task} without {missing}")

    await each_supported(target, check)


@rule(
    "tasks.batch-non-empty",
    SECTION,
    "Each request batch must be non-empty.",
)
async def batch_non_empty(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        if task == "score":
            request: Any = pb.ScoreRequest(context=context(target))
        else:
            request = build(target, task, caps)
            del request.inputs[:]
        await target.expect_status(call(target, task)(request), _INVALID, what=f"an empty {task} batch")

    await each_supported(target, check)


@rule(
    "tasks.item-ids",
    SECTION,
    "item_id is required and unique within an embed/classify batch, and every query/candidate item ID is unique "
    "within one score group.",
)
async def item_ids(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        duplicate = build(target, task, caps, [item(target, caps, "same", "a"), item(target, caps, "same", "b")])
        await target.expect_status(call(target, task)(duplicate), _INVALID, what=f"{task}: duplicate item_id")
        unnamed = build(target, task, caps, [item(target, caps, "", "a"), item(target, caps, "named", "b")])
        await target.expect_status(call(target, task)(unnamed), _INVALID, what=f"{task}: an input without item_id")

    await each_supported(target, check)


@rule(
    "tasks.one-input-variant",
    SECTION,
    "Exactly one TaskInput.input variant is set.",
)
async def one_input_variant(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        request = build(target, task, caps, [pb.TaskInput(item_id="empty"), item(target, caps, "other")])
        await target.expect_status(call(target, task)(request), _INVALID, what=f"{task}: an input with no variant")

    await each_supported(target, check)


@rule(
    "tasks.multimodal-needs-media",
    SECTION,
    "A multimodal input must contain at least one MediaItem; its optional prompt is either text or token IDs, "
    "never both.",
)
async def multimodal_needs_media(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        empty = pb.TaskInput(item_id="media", multimodal=pb.MultimodalTaskInput(text="describe"))
        request = build(target, task, caps, [empty, item(target, caps, "other")])
        await target.expect_status(call(target, task)(request), _INVALID, what=f"{task}: multimodal without media")

    await each_supported(target, check)


@rule(
    "tasks.input-types",
    "Task capability discovery",
    "TaskCapabilities advertise input_types; malformed input or unsupported explicit options are rejected with "
    "INVALID_ARGUMENT.",
)
async def input_types(target: Target) -> None:
    tried = 0

    async def check(task: str, caps: Any) -> None:
        nonlocal tried
        types = list(caps.input_types)
        probes = {
            pb.TASK_INPUT_TYPE_TEXT: pb.TaskInput(item_id="x", text="conformance"),
            pb.TASK_INPUT_TYPE_TOKEN_IDS: pb.TaskInput(item_id="x", token_ids=pb.TokenIds(ids=[1, 2, 3])),
        }
        for kind, probe in probes.items():
            if types and kind not in types:
                request = build(target, task, caps, [probe, item(target, caps, "other")])
                name = pb.TaskInputType.Name(kind)
                await target.expect_status(call(target, task)(request), _INVALID, what=f"{task}: unadvertised {name}")
                tried += 1

    await each_supported(target, check)
    target.require(tried > 0, "a task input type it does not accept")


@rule(
    "tasks.context-options",
    SECTION,
    "Clients must use either option (priority, lora_name) only when the corresponding task capability advertises "
    "support. The server rejects ... unsupported explicit options with INVALID_ARGUMENT.",
)
async def context_options(target: Target) -> None:
    tried = 0

    async def check(task: str, caps: Any) -> None:
        nonlocal tried
        if denied(caps, "supports_priority"):
            request = build(target, task, caps, priority=1)
            await target.expect_status(call(target, task)(request), _INVALID, what=f"{task}: unadvertised priority")
            tried += 1
        elif advertised(caps, "supports_priority"):
            await call(target, task)(build(target, task, caps, priority=1))  # an advertised option is honoured
            tried += 1
        if denied(caps, "supports_lora"):
            request = build(target, task, caps, lora_name="conformance-adapter")
            await target.expect_status(call(target, task)(request), _INVALID, what=f"{task}: unadvertised lora_name")
            tried += 1

    await each_supported(target, check)
    target.require(tried > 0, "a task that reports its priority or LoRA support")


@rule(
    "tasks.batch-limit",
    "Task capability discovery",
    "Reported dimensions and limits are greater than zero: max_batch_size, max_groups and "
    "max_candidates_per_group bound a request, and a request beyond them is rejected with INVALID_ARGUMENT.",
)
async def batch_limit(target: Target) -> None:
    tried = 0

    async def check(task: str, caps: Any) -> None:
        nonlocal tried
        limit_field = "max_candidates_per_group" if task == "score" else "max_batch_size"
        if not caps.HasField(limit_field) or getattr(caps, limit_field) > 1024:
            return
        count = getattr(caps, limit_field) + 1
        inputs = [item(target, caps, f"i{n}", f"item {n}") for n in range(count + 1)]
        await target.expect_status(
            call(target, task)(build(target, task, caps, inputs)), _INVALID, what=f"{task}: more than {limit_field}"
        )
        tried += 1
        if task == "score" and caps.HasField("max_groups") and caps.max_groups <= 1024:
            query, candidate = item(target, caps, "query", "query"), item(target, caps, "candidate", "candidate")
            groups = [
                pb.ScoreGroup(group_id=f"g{n}", query=query, candidates=[candidate]) for n in range(caps.max_groups + 1)
            ]
            request = pb.ScoreRequest(context=context(target), groups=groups)
            await target.expect_status(target.client.score(request), _INVALID, what="score: more than max_groups")

    await each_supported(target, check)
    target.require(tried > 0, "a task batch limit")


@rule(
    "tasks.usage",
    SECTION,
    "cached_input_tokens, when present, does not exceed input_tokens. A successful unary response is terminal.",
)
async def usage(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        request = build(target, task, caps)
        response = await call(target, task)(request)
        if response.request_id != request.context.request_id:
            raise CheckFailed(f"{task}: response request_id {response.request_id!r} != {request.context.request_id!r}")
        task_usage = response.usage
        if task_usage.HasField("cached_input_tokens") and task_usage.cached_input_tokens > task_usage.input_tokens:
            raise CheckFailed(f"{task}: cached_input_tokens exceeds input_tokens")

    await each_supported(target, check)


@rule(
    "tasks.shared-request-ids",
    SECTION,
    "Request IDs share the same namespace and abort semantics as generation request IDs.",
)
async def shared_request_ids(target: Target) -> None:
    target.require_generation()
    supported = [(t, c) for t in TASKS if (c := task_caps(target, t)) is not None]
    target.require(bool(supported), "any of Embed, Classify or Score")
    request = target.long_request()
    held = target.open_call(request)
    try:
        await held.first()
        for task, caps in supported:
            duplicate = build(target, task, caps)
            duplicate.context.request_id = request.request_id
            try:
                await target.expect_status(
                    call(target, task)(duplicate),
                    grpc.StatusCode.ALREADY_EXISTS,
                    what=f"{task} reusing the request_id of an in-flight Generate",
                )
            except CheckFailed:
                if await still_running(target, request.request_id, held.rest()):
                    raise
                raise NotApplicable(f"the long request ended about when the {task} reusing its id arrived") from None
    finally:
        held.cancel()


@rule(
    "tasks.abort-after-finish",
    SECTION,
    "Abort(request_id) follows the same semantics as generation. ALREADY_FINISHED remains a successful "
    "idempotent outcome rather than an error.",
)
async def abort_after_finish(target: Target) -> None:
    async def check(task: str, caps: Any) -> None:
        request = build(target, task, caps)
        await call(target, task)(request)
        for _ in range(2):
            response = await abort_request(target, pb.AbortRequest(request_id=request.context.request_id))
            if response.status != pb.ABORT_STATUS_ALREADY_FINISHED:
                raise CheckFailed(
                    f"Abort after a finished {task}: {pb.AbortStatus.Name(response.status)}, expected ALREADY_FINISHED"
                )

    await each_supported(target, check)


__all__ = [
    "TASKS",
    "build",
    "call",
    "context",
    "each_supported",
    "item",
    "reported_unsupported",
    "require_task",
    "task_caps",
    "unadvertised",
]
