"""Engine identity, schema revision and model discovery."""

from __future__ import annotations

import grpc

from ..kit import CheckFailed, Target, rule

SECTION = "Core identity and roles"


@rule(
    "engine-info.schema-revision",
    SECTION,
    "Every server must populate schema_revision with the exact monotonically increasing contract revision "
    "it implements. Zero is invalid. Servers implementing this contract advertise schema_revision = 1 and "
    "minimum_client_revision = 1.",
)
async def schema_revision(target: Target) -> None:
    info = await target.client.get_engine_info()
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
    release = (await target.client.get_engine_info()).schema_release
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


__all__: list[str] = []
