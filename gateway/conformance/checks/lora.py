"""The LoRA lifecycle: validation, idempotent loads, conflicts, unknown adapters, a disabled engine."""

from __future__ import annotations

import functools
import secrets
import shutil
import tempfile

import grpc

from ... import pb
from ...client import StatusError
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import advertised

SECTION = "LoRA lifecycle"
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _enabled(target: Target) -> bool:
    return advertised(target.model_info, "supports_lora")


def _disabled(target: Target) -> bool:
    return target.model_info.HasField("supports_lora") and not target.model_info.supports_lora


async def _remove(*directories: str) -> None:
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


def _name() -> str:
    return f"conformance-{secrets.token_hex(4)}"


async def _served_elsewhere(target: Target) -> str | None:
    """Another model of the endpoint that advertises LoRA, if any."""
    for model in target.engine_info.supported_models:
        if model != target.model and advertised(await target.client.model_info(model), "supports_lora"):
            return model
    return None


@rule("lora.disabled", SECTION, "A LoRA-disabled engine returns FAILED_PRECONDITION.")
async def disabled(target: Target) -> None:
    target.require(_disabled(target), "supports_lora = false")
    other = await _served_elsewhere(target)
    if other is not None:
        raise NotApplicable(
            f"model {other!r} of this endpoint advertises supports_lora = true, and the LoRA RPCs are "
            "endpoint-wide (they name no model)"
        )
    adapter = pb.LoraAdapter(lora_id=1, lora_name=_name(), source_path=tempfile.gettempdir())
    code = grpc.StatusCode.FAILED_PRECONDITION
    await target.expect_status(target.load_lora(adapter), code, what="LoadLora")
    await target.expect_status(target.client.unload_lora(adapter.lora_name), code, what="UnloadLora")
    await target.expect_status(target.client.list_loras(), code, what="ListLoras")


@rule(
    "lora.generate-disabled",
    SECTION,
    "supports_lora=true means the engine accepts GenerateRequest.lora_name and the LoRA lifecycle RPCs on "
    "OpenEngine. A LoRA-disabled engine returns FAILED_PRECONDITION.",
)
async def generate_disabled(target: Target) -> None:
    target.require_generation()
    target.require(_disabled(target), "supports_lora = false")
    request = target.prompt(max_tokens=1)
    request.lora_name = _name()
    await target.expect_rejected(
        request, grpc.StatusCode.FAILED_PRECONDITION, what="Generate with lora_name on a LoRA-disabled engine"
    )


@rule(
    "lora.validation",
    SECTION,
    "lora_id must be positive. lora_name must be non-empty. source_path must be an absolute directory visible to "
    "the engine.",
)
async def validation(target: Target) -> None:
    target.require(_enabled(target), "supports_lora = true")
    directory = tempfile.gettempdir()
    cases = {
        "lora_id 0": pb.LoraAdapter(lora_id=0, lora_name=_name(), source_path=directory),
        "a negative lora_id": pb.LoraAdapter(lora_id=-3, lora_name=_name(), source_path=directory),
        "an empty lora_name": pb.LoraAdapter(lora_id=987_001, lora_name="", source_path=directory),
        "a relative source_path": pb.LoraAdapter(lora_id=987_002, lora_name=_name(), source_path="adapters/x"),
        "an empty source_path": pb.LoraAdapter(lora_id=987_003, lora_name=_name(), source_path=""),
    }
    for what, adapter in cases.items():
        await target.expect_status(target.load_lora(adapter), _INVALID, what=f"LoadLora with {what}")
    missing = pb.LoraAdapter(lora_id=987_004, lora_name=_name(), source_path=f"/conformance-missing-{_name()}")
    await target.expect_status(
        target.load_lora(missing),
        _INVALID,
        grpc.StatusCode.NOT_FOUND,
        what="LoadLora from a directory that does not exist",
    )


@rule("lora.unknown", SECTION, "An unknown adapter returns NOT_FOUND.")
async def unknown(target: Target) -> None:
    target.require(_enabled(target), "supports_lora = true")
    name = _name()
    await target.expect_status(target.client.unload_lora(name), grpc.StatusCode.NOT_FOUND, what="UnloadLora")
    if target.role == pb.ENGINE_ROLE_AGGREGATED:
        request = target.prompt(max_tokens=1)
        request.lora_name = name
        await target.expect_rejected(request, grpc.StatusCode.NOT_FOUND, what="Generate naming an unknown adapter")


@rule(
    "lora.lifecycle",
    SECTION,
    "Loading the same ID, name, and path twice is idempotent. A conflicting ID, name, or path returns "
    "ALREADY_EXISTS. An unknown adapter returns NOT_FOUND. supports_lora=true means the engine accepts "
    "GenerateRequest.lora_name and the LoRA lifecycle RPCs.",
)
async def lifecycle(target: Target) -> None:
    target.require(_enabled(target), "supports_lora = true")
    existing = await target.client.list_loras()
    lora_id = max((a.lora_id for a in existing), default=0) + 1 + secrets.randbelow(1000)
    root = tempfile.mkdtemp(prefix="conformance-lora-")
    other = tempfile.mkdtemp(prefix="conformance-lora-")
    target.on_exit(functools.partial(_remove, root, other))  # last: after the adapters are unloaded
    adapter = pb.LoraAdapter(lora_id=lora_id, lora_name=_name(), source_path=root)
    try:
        first = await target.load_lora(adapter)
    except StatusError as error:
        raise NotApplicable(f"the engine cannot load an empty adapter directory ({error.code.name})") from None
    again = await target.load_lora(adapter)
    if not again.already_loaded or first.already_loaded:
        raise CheckFailed(f"already_loaded is {first.already_loaded} then {again.already_loaded}")
    if again.adapter.lora_name != adapter.lora_name or again.adapter.lora_id != lora_id:
        raise CheckFailed(f"the idempotent load returned {again.adapter}")
    if adapter.lora_name not in [a.lora_name for a in await target.client.list_loras()]:
        raise CheckFailed("ListLoras does not list the loaded adapter")
    conflicts = {
        "the same name with another id": pb.LoraAdapter(
            lora_id=lora_id + 1000, lora_name=adapter.lora_name, source_path=root
        ),
        "the same name with another path": pb.LoraAdapter(
            lora_id=lora_id, lora_name=adapter.lora_name, source_path=other
        ),
        "the same id with another name": pb.LoraAdapter(lora_id=lora_id, lora_name=_name(), source_path=other),
        "the same path with another name and id": pb.LoraAdapter(
            lora_id=lora_id + 2000, lora_name=_name(), source_path=root
        ),
    }
    for what, conflict in conflicts.items():
        await target.expect_status(
            target.load_lora(conflict), grpc.StatusCode.ALREADY_EXISTS, what=f"LoadLora with {what}"
        )
    if target.role == pb.ENGINE_ROLE_AGGREGATED and target.model_info.HasField("generation"):
        # supports_lora = true means the engine accepts GenerateRequest.lora_name: the loaded one.
        (await target.run(target.prompt(max_tokens=1, lora_name=adapter.lora_name))).succeeded()
    unloaded = await target.client.unload_lora(adapter.lora_name)
    if unloaded.adapter.lora_name != adapter.lora_name:
        raise CheckFailed(f"UnloadLora returned {unloaded.adapter}")
    if adapter.lora_name in [a.lora_name for a in await target.client.list_loras()]:
        raise CheckFailed("ListLoras still lists the unloaded adapter")
    await target.expect_status(
        target.client.unload_lora(adapter.lora_name), grpc.StatusCode.NOT_FOUND, what="a second UnloadLora"
    )


__all__: list[str] = []
