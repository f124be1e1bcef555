"""Driver settings → keyword arguments for TensorRT-LLM's ``LLM``: pure, no TensorRT-LLM import.

``engine.py`` passes the names ``LLM`` accepts (``TorchLlmArgs.model_fields``); everything else
here is plain validation and conversion, so a misspelt option fails before a model loads for
minutes. Scalars from the command line stay strings (``TorchLlmArgs`` is a pydantic model and
coerces ``"512"`` and ``"true"`` itself); nested configs arrive as JSON text and are parsed here.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from openengine_gateway.spi import ConfigurationError

DRIVER_DEFAULTS: Mapping[str, Any] = {"enable_iter_perf_stats": True}
"""What the driver turns on unless told otherwise: iteration statistics feed ``GetLoad``."""

_FALSE = frozenset({"false", "0", "off", "no", "n", "f"})
"""How pydantic reads a false bool from a string (the command line's form)."""


def cli_value(value: Any) -> Any:
    """A command-line string holding a JSON object or array (a nested config) as that value."""
    if not isinstance(value, str) or not value.lstrip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ConfigurationError(f"trtllm: {value!r} looks like JSON but does not parse: {exc}") from None


def llm_kwargs(options: Mapping[str, Any], known: Collection[str], *, role: str) -> dict[str, Any]:
    """``LLM`` keyword arguments (``model`` excluded) from the driver's options.

    Raises ``ConfigurationError`` naming an option ``LLM`` does not take, a backend other than the
    PyTorch one, a prefill/decode role without the cache transceiver it needs, a prefill role
    with the overlap scheduler on, or a ``lora_config`` TensorRT-LLM cannot start with. A prefill
    engine gets ``disable_overlap_scheduler`` unless told otherwise: TensorRT-LLM 1.2.1 refuses
    every context-only request under the overlap scheduler, whose default is on, and ends its
    worker doing so (``executor/base_worker.py``, ``_enqueue_request``, outside its ``try``); the
    later text read as 1.3's has no such check, and the setting is kept there (it costs only
    overlap on a prefill engine).
    """
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigurationError(
            f"trtllm: unknown LLM arguments: {', '.join(unknown)} (see TensorRT-LLM's TorchLlmArgs)"
        )
    kwargs = {**DRIVER_DEFAULTS, **{name: cli_value(value) for name, value in options.items()}}
    backend = kwargs.pop("backend", "pytorch")
    if backend != "pytorch":
        raise ConfigurationError(f"trtllm: backend {backend!r} is not served; this driver runs the PyTorch backend")
    if role != "aggregated" and not kwargs.get("cache_transceiver_config"):
        raise ConfigurationError(f"trtllm: a {role} engine needs cache_transceiver_config (the KV transfer backend)")
    if role == "prefill":
        if _is_false(kwargs.get("disable_overlap_scheduler", True)):
            raise ConfigurationError(
                "trtllm: a prefill engine needs disable_overlap_scheduler=true: TensorRT-LLM refuses "
                "context-only requests while the overlap scheduler is on"
            )
        kwargs["disable_overlap_scheduler"] = True
    _check_lora_config(kwargs.get("lora_config"))
    return kwargs


def _check_lora_config(config: Any) -> None:
    """What ``create_py_executor`` asserts once the model has loaded, checked before it loads.

    Unless ``lora_dir`` names exactly one adapter (whose own config then says which modules it
    adapts), TensorRT-LLM sizes its LoRA cache from ``lora_target_modules`` and asserts that at
    least one is given (``_torch/pyexecutor/py_executor_creator.py``, the 1.2.1 and 1.3 texts).
    """
    if not isinstance(config, Mapping):
        return
    if len(config.get("lora_dir") or ()) != 1 and not config.get("lora_target_modules"):
        raise ConfigurationError(
            "trtllm: lora_config needs lora_target_modules (TensorRT-LLM's module names, for a Llama adapter "
            '["attn_q", "attn_k", "attn_v", "attn_dense"], and "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate" for its MLP) '
            "unless lora_dir names exactly one adapter: TensorRT-LLM cannot start without them"
        )


def _is_false(value: Any) -> bool:
    """Whether an option's value reads as false (a TOML value, or a command-line string)."""
    if isinstance(value, str):
        return value.strip().lower() in _FALSE
    return not value


__all__ = ["DRIVER_DEFAULTS", "cli_value", "llm_kwargs"]
