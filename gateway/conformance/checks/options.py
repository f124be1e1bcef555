"""Generation options against what the model advertises: inputs, priority, prefix-cache options, media."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf.message import Message

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import advertised, present

SECTION = "Generation API"
MODELS = "Model and capacity metadata"
_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_ADVERTISED = (
    "The remaining generation fields advertise support and limits for the corresponding request options; an "
    "explicit option the model does not advertise is rejected before acceptance."
)


def _reported_false(message: Message, field: str) -> bool:
    """The model reports ``field`` as explicitly false."""
    return present(message, field) and not getattr(message, field)


def _priority(request: pb.GenerateRequest) -> None:
    request.priority = 5


def _cache_salt(request: pb.GenerateRequest) -> None:
    request.kv.cache_salt = "conformance"


def _bypass(request: pb.GenerateRequest) -> None:
    request.kv.bypass_prefix_cache = True


@rule("options.input-kinds", MODELS, _ADVERTISED)
async def input_kinds(target: Target) -> None:
    target.require_generation()
    info, tried = target.model_info, 0
    if _reported_false(info, "supports_text_input"):
        request = target.prompt(max_tokens=1)
        request.prompt = "text"
        await target.expect_rejected(request, _INVALID, what="a text prompt with supports_text_input = false")
        tried += 1
    if _reported_false(info, "supports_token_ids_input"):
        request = target.prompt(max_tokens=1)
        request.token_ids.ids.extend([1, 2, 3])
        await target.expect_rejected(request, _INVALID, what="token ids with supports_token_ids_input = false")
        tried += 1
    if _reported_false(info, "supports_multimodal"):
        request = target.prompt(max_tokens=1)
        request.media.add(modality=pb.MODALITY_IMAGE, data_uri="data:image/png;base64,iVBORw0KGgo=")
        await target.expect_rejected(request, _INVALID, what="media with supports_multimodal = false")
        tried += 1
    target.require(tried > 0, "an input kind it does not accept")


@rule("options.scheduling-and-cache", SECTION, _ADVERTISED)
async def scheduling_and_cache(target: Target) -> None:
    target.require_generation()
    generation, tried = target.model_info.generation, 0
    probes: dict[str, tuple[str, Callable[[pb.GenerateRequest], None]]] = {
        "supports_priority": ("priority", _priority),
        "supports_cache_salt": ("kv.cache_salt", _cache_salt),
        "supports_prefix_cache_bypass": ("kv.bypass_prefix_cache", _bypass),
    }
    for capability, (option, apply) in probes.items():
        request = target.prompt(max_tokens=1)
        apply(request)
        if advertised(generation, capability):
            (await target.run(request)).succeeded()
        elif present(generation, capability):
            await target.expect_rejected(request, _INVALID, what=f"{option} with {capability} = false")
        tried += 1
    target.require(tried > 0, "scheduling or cache options")


async def _cached(target: Target, request: pb.GenerateRequest, **kv: object) -> int | None:
    """cached_prompt_tokens of a run of ``request`` (fresh id) with ``kv`` options; None when unreported."""
    run = pb.GenerateRequest()
    run.CopyFrom(request)
    run.request_id = target.request_id("cache")
    for name, value in kv.items():
        setattr(run.kv, name, value)
    usage = (await target.run(run)).succeeded().usage
    return usage.cached_prompt_tokens if usage.HasField("cached_prompt_tokens") else None


async def _warm_hit(target: Target, request: pb.GenerateRequest, **kv: object) -> None:
    """Run ``request`` twice; ``NotApplicable`` unless the second run reports a prefix-cache hit."""
    await _cached(target, request, **kv)
    hit = await _cached(target, request, **kv)
    if not hit:
        raise NotApplicable("the engine reports no prefix-cache hit for a repeated prompt")


@rule(
    "options.bypass-prefix-cache",
    SECTION,
    "bypass_prefix_cache = true skips prefix cache reuse but does not prevent newly computed blocks from being cached.",
)
async def bypass_prefix_cache(target: Target) -> None:
    target.require_generation()
    target.require(advertised(target.model_info.generation, "supports_prefix_cache_bypass"), "prefix-cache bypass")
    warm = target.fresh_prompt(max_tokens=1)
    await _warm_hit(target, warm)
    bypassed = await _cached(target, warm, bypass_prefix_cache=True)
    if bypassed:
        raise CheckFailed(f"bypass_prefix_cache reused {bypassed} cached prompt tokens")
    fresh = target.fresh_prompt(max_tokens=1)
    await _cached(target, fresh, bypass_prefix_cache=True)
    if not await _cached(target, fresh):
        raise CheckFailed("blocks computed by a bypassing request were not cached for the next request")


@rule("options.cache-salt", SECTION, "cache_salt namespaces the prefix-cache key.")
async def cache_salt(target: Target) -> None:
    target.require_generation()
    target.require(advertised(target.model_info.generation, "supports_cache_salt"), "cache_salt")
    request = target.fresh_prompt(max_tokens=1)
    await _warm_hit(target, request, cache_salt="conformance-a")
    for salt in ("conformance-b", None):
        cached = await _cached(target, request, **({"cache_salt": salt} if salt else {}))
        if cached:
            raise CheckFailed(f"a prompt cached under salt 'conformance-a' hit the cache with salt {salt!r}: {cached}")


__all__: list[str] = []
