"""One Generate on the started engine: the prompt rendered and the ``SamplingParams`` verified before
acceptance (a request vLLM would refuse is a gRPC status, not a stream error), then vLLM's DELTA
outputs mapped by ``outputs.RequestStream``. vLLM is imported by the functions that use it."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument, RequestError
from openengine_gateway.spi import GenerationEvent, GenerationRequest, Media, UsageReport

from .failures import engine_failure
from .mapping import GenerationPlan
from .outputs import RequestStream

_MODALITIES = {pb.MODALITY_IMAGE: "image", pb.MODALITY_VIDEO: "video", pb.MODALITY_AUDIO: "audio"}


def render(engine: Any, prompt: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine input for a text or token prompt: tokenized here, once, before acceptance."""
    from vllm.exceptions import VLLMValidationError

    renderer = engine.renderer
    try:
        (engine_input,) = renderer.render_cmpl([prompt])
        renderer.validate_token_ids(engine_input["prompt_token_ids"])
    except (VLLMValidationError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"vLLM rejected the prompt: {exc}") from None
    result: dict[str, Any] = engine_input
    return result


def sampling_params(engine: Any, plan: GenerationPlan) -> Any:
    """``SamplingParams`` (DELTA output), verified against the engine's config."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    config = engine.vllm_config
    try:
        structured = StructuredOutputsParams(**plan.structured_outputs) if plan.structured_outputs else None
        params = SamplingParams(**plan.sampling, structured_outputs=structured, output_kind=RequestOutputKind.DELTA)
        params.verify(
            config.model_config, config.speculative_config, config.structured_outputs_config, engine.tokenizer
        )
    except (VLLMValidationError, ValueError) as exc:
        raise InvalidArgument(f"vLLM rejected the request: {exc}") from None
    return params


def token_text(engine: Any, token_id: int) -> str:
    """One token's text, decoded as vLLM decodes its logprob tokens."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    tokenizer = engine.tokenizer
    return convert_ids_list_to_tokens(tokenizer, [token_id])[0] if tokenizer is not None else ""


async def stream_outputs(
    engine: Any,
    request: GenerationRequest,
    prompt: dict[str, Any],
    params: Any,
    plan: GenerationPlan,
    lora: Any,
    stream: RequestStream,
) -> AsyncIterator[GenerationEvent]:
    if not request.media:  # rendered here: a request ended before vLLM's first output still counts it
        yield UsageReport(prompt_tokens=len(prompt["prompt_token_ids"]), completion_tokens=0)
    else:
        prompt = {**prompt, **await media_input(request.media)}
    outputs = engine.generate(
        prompt,
        params,
        request.request_id,
        lora_request=lora,
        priority=plan.priority,
        data_parallel_rank=request.data_parallel_rank,
    )
    try:
        async for output in outputs:
            try:
                events = stream.events(output)
            except EngineFailure:
                yield stream.usage(output)  # the terminal error still counts the prompt
                raise
            for event in events:
                yield event
    except (EngineFailure, RequestError, asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as exc:  # broad on purpose: every vLLM failure becomes one EngineError
        raise engine_failure(exc) from exc
    finally:
        await outputs.aclose()


async def media_input(media: tuple[Media, ...]) -> dict[str, Any]:
    """vLLM's ``multi_modal_data``: media fetched and decoded by vLLM's ``MediaConnector``."""
    from vllm.multimodal.media import MediaConnector

    connector = MediaConnector()
    fetch: dict[str, Any] = {
        "image": connector.fetch_image_async,
        "video": connector.fetch_video_async,
        "audio": connector.fetch_audio_async,
    }
    data: dict[str, list[Any]] = {}
    uuids: dict[str, list[str | None]] = {}
    for item in media:
        kind = _MODALITIES[item.modality]
        url = item.url or item.data_uri
        if url is None:
            mime = item.mime_type or f"{kind}/*"
            url = f"data:{mime};base64,{base64.b64encode(item.raw_bytes or b'').decode()}"
        loaded = await fetch[kind](url)
        data.setdefault(kind, []).append(loaded[0] if kind == "video" else loaded)
        uuids.setdefault(kind, []).append(item.uuid or None)
    return {"multi_modal_data": data, "multi_modal_uuids": uuids}


__all__ = ["media_input", "render", "sampling_params", "stream_outputs", "token_text"]
