"""vLLM's exceptions as the contract's failures, for generation and task calls alike."""

from __future__ import annotations

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure


def engine_failure(exc: BaseException) -> EngineFailure:
    """A vLLM exception raised after acceptance as the contract's terminal failure."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    kind = type(exc).__name__
    if isinstance(exc, VLLMValidationError):
        return EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, f"vLLM rejected the request: {exc}")
    if isinstance(exc, EngineDeadError):
        return EngineFailure(pb.ERROR_CODE_INTERNAL, "the vLLM engine core died", retryable=True, retry_after_ms=1000)
    if kind in ("QueueOverflowError", "MaxQueuedTokensError"):
        return EngineFailure(pb.ERROR_CODE_OVERLOADED, f"vLLM is full: {exc}", retryable=True, retry_after_ms=100)
    cause = exc.__cause__ or exc
    return EngineFailure(pb.ERROR_CODE_INTERNAL, f"vLLM failed: {type(cause).__name__}: {cause}")


__all__ = ["engine_failure"]
