"""Engine identity, schema revision and model discovery."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
from google.protobuf.message import Message

from ... import pb
from ...contract.capabilities import MODEL_LIMITS, TASK_LIMITS, TASK_LISTS
from ..kit import CheckFailed, Target, rule

SECTION = "Core identity and roles"
MODELS = "Model and capacity metadata"
TASKS = "Task capability discovery"


@rule(
    "engine-info.schema-revision",
    SECTION,
    "Every server must populate schema_revision with the exact monotonically increasing contract revision "
    "it implements. Zero is invalid. Servers implementing this contract advertise schema_revision = 1 and "
    "minimum_client_revision = 1.",
)
async def schema_revision(target: Target) -> None:
    info = await target.client.identity()  # the layout's own: the later layout's ServerInfo there
    if info.schema_revision != 1:
        raise CheckFailed(f"schema_revision is {info.schema_revision}, expected 1")
    if info.minimum_client_revision != 1:
        raise CheckFailed(f"minimum_client_revision is {info.minimum_client_revision}, expected 1")


@rule(
    "engine-info.schema-release",
    SECTION,
    "schema_release with an immutable OpenEngine repository release or source tag containing that revision. "
    "Moving branch names such as main are not valid.",
)
async def schema_release(target: Target) -> None:
    release = (await target.client.identity()).schema_release
    if not release or release in {"main", "master", "HEAD", "latest"}:
        raise CheckFailed(f"schema_release {release!r} is not an immutable release")


@rule(
    "model-info.unknown-model",
    "Model and capacity metadata",
    "GetModelInfoRequest.model is required and selects one of EngineInfo.supported_models; an unknown model "
    "returns gRPC NOT_FOUND.",
)
async def unknown_model(target: Target) -> None:
    await target.expect_status(
        target.client.model_info("conformance-no-such-model"), grpc.StatusCode.NOT_FOUND, what="unknown model"
    )
    for name in target.engine_info.supported_models:
        info = await target.client.model_info(name)
        if name not in (info.served_model_name, *info.served_model_aliases):
            raise CheckFailed(f"GetModelInfo({name!r}) describes {info.served_model_name!r}, not {name!r}")


@rule(
    "model-info.model-required",
    MODELS,
    "GetModelInfoRequest.model is required and selects one of EngineInfo.supported_models.",
)
async def model_required(target: Target) -> None:
    await target.expect_status(target.client.model_info(""), grpc.StatusCode.INVALID_ARGUMENT, what="empty model")


def _task_capabilities(info: pb.ModelInfo) -> Iterator[tuple[str, Message]]:
    """The task capability messages a model reports (present ones only)."""
    if info.HasField("tasks"):
        for task in ("embed", "classify", "score"):
            if info.tasks.HasField(task):
                yield task, getattr(info.tasks, task)


@rule(
    "model-info.no-unspecified-in-lists",
    TASKS,
    "Capability lists never contain UNSPECIFIED.",
)
async def no_unspecified(target: Target) -> None:
    info, generation = target.model_info, target.model_info.generation
    lists: dict[str, Sequence[int]] = {
        "generation.prompt_logprobs.candidate_selection_modes": generation.prompt_logprobs.candidate_selection_modes,
        "generation.output_logprobs.candidate_selection_modes": generation.output_logprobs.candidate_selection_modes,
        "generation.guided_decoding.modes": generation.guided_decoding.modes,
    }
    for task, caps in _task_capabilities(info):
        for name in TASK_LISTS:
            if name in caps.DESCRIPTOR.fields_by_name:
                lists[f"tasks.{task}.{name}"] = getattr(caps, name)
    for where, values in lists.items():
        if 0 in values:
            raise CheckFailed(f"ModelInfo.{where} contains UNSPECIFIED")


@rule(
    "model-info.limits-positive",
    TASKS,
    "Reported dimensions and limits are greater than zero.",
)
async def limits_positive(target: Target) -> None:
    info, generation = target.model_info, target.model_info.generation
    reported: list[tuple[str, Message, str]] = [(f"ModelInfo.{n}", info, n) for n in MODEL_LIMITS]
    reported += [
        ("generation.max_num_sequences", generation, "max_num_sequences"),
        ("generation.prompt_logprobs.max_top_n", generation.prompt_logprobs, "max_top_n"),
        ("generation.output_logprobs.max_top_n", generation.output_logprobs, "max_top_n"),
    ]
    for task, caps in _task_capabilities(info):
        reported += [(f"tasks.{task}.{n}", caps, n) for n in TASK_LIMITS if n in caps.DESCRIPTOR.fields_by_name]
    for where, message, name in reported:
        if message.HasField(name) and getattr(message, name) <= 0:
            raise CheckFailed(f"{where} is reported as {getattr(message, name)}; limits must be > 0")


@rule(
    "model-info.task-modalities",
    TASKS,
    "modalities is meaningful only when the task includes TASK_INPUT_TYPE_MULTIMODAL, and never contains "
    "MODALITY_UNSPECIFIED.",
)
async def task_modalities(target: Target) -> None:
    for task, caps in _task_capabilities(target.model_info):
        modalities = list(caps.modalities)  # type: ignore[attr-defined]
        if pb.MODALITY_UNSPECIFIED in modalities:
            raise CheckFailed(f"tasks.{task}.modalities contains MODALITY_UNSPECIFIED")
        if modalities and pb.TASK_INPUT_TYPE_MULTIMODAL not in caps.input_types:  # type: ignore[attr-defined]
            raise CheckFailed(f"tasks.{task}.modalities is set but input_types lacks TASK_INPUT_TYPE_MULTIMODAL")


__all__: list[str] = []
