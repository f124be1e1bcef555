"""TensorRT-LLM's refusals of one request → the gateway error with the right status: pure.

``BaseWorker._enqueue_request`` wraps every failure to enqueue in ``RequestError``
(``executor/utils.py``), which TensorRT-LLM 1.2.1 delivers while the result is read, before any
output; older proxies raised it from ``generate_async``. Its message is the only clue to whose
fault it is: the ones recognisable as the caller's (a prompt the context cannot hold, an adapter
that no longer loads) get the caller's status, anything else is the engine's (INTERNAL).
"""

from __future__ import annotations

from openengine_gateway.errors import FailedPrecondition, Internal, InvalidArgument, RequestError

_CALLER_FAULTS: tuple[tuple[tuple[str, ...], type[RequestError]], ...] = (
    (("max_seq_len", "max_num_tokens", "max_tokens", "prompt length", "prompt_token_ids"), InvalidArgument),
    (("lora", "adapter"), FailedPrecondition),
)


def is_request_error(exc: BaseException) -> bool:
    """Whether ``exc`` is TensorRT-LLM's ``RequestError`` (matched by name: the class is not imported)."""
    return type(exc).__name__ == "RequestError"


def refusal(exc: BaseException) -> RequestError:
    """The gateway error for TensorRT-LLM's ``RequestError`` ``exc``: the caller's status when recognisable."""
    message = str(exc)
    lowered = message.lower()
    for words, status in _CALLER_FAULTS:
        if any(word in lowered for word in words):
            return status(f"TensorRT-LLM refused the request: {message}")
    return Internal(f"TensorRT-LLM could not enqueue the request: {message}")


__all__ = ["is_request_error", "refusal"]
