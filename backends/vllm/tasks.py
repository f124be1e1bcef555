"""Embed, Classify and Score on the started engine: the pooling runner's task engine, and vLLM's
failures of a task call as the contract's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from openengine_gateway.errors import EngineFailure, InvalidArgument, RequestError

from .capabilities import EngineFeatures
from .failures import engine_failure
from .pooling import PoolingEngine, PoolingModel, task_capabilities

T = TypeVar("T")


def pooling_engine(engine: Any, config: Any, features: EngineFeatures) -> PoolingEngine | None:
    """The task runner when vLLM runs the pooling runner for this model."""
    from vllm.pooling_params import PoolingParams

    model_config = config.model_config
    if model_config.runner_type != "pooling":
        return None
    pooler = model_config.pooler_config
    id2label = getattr(model_config.hf_config, "id2label", None) or {}
    model = PoolingModel(
        tasks=features.supported_tasks,
        dimension=model_config.embedding_size,
        labels=tuple(str(id2label[key]) for key in sorted(id2label)),
        matryoshka=bool(model_config.is_matryoshka),
        activation_default=pooler is None or pooler.use_activation is not False,
        lora=config.lora_config is not None,
        priority=config.scheduler_config.policy == "priority",
        text=features.has_tokenizer,
    )
    if task_capabilities(model) is None:
        return None
    return PoolingEngine(engine, model, PoolingParams)


async def pooled(work: Awaitable[T]) -> T:
    """A task call on the pooling runner: vLLM refusing an input (too long, a token outside the
    vocabulary) refuses the call with INVALID_ARGUMENT; any other vLLM failure is an ``EngineFailure``."""
    from vllm.exceptions import VLLMValidationError

    try:
        return await work
    except VLLMValidationError as exc:
        raise InvalidArgument(f"vLLM rejected the input: {exc}") from None
    except (EngineFailure, RequestError, asyncio.CancelledError):
        raise
    except Exception as exc:  # broad on purpose: every other vLLM failure becomes one EngineFailure
        raise engine_failure(exc) from exc


__all__ = ["pooled", "pooling_engine"]
