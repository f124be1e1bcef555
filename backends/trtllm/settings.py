"""``TrtllmSettings``: the model to serve, its disaggregation role, and TensorRT-LLM ``LLM`` arguments.

Every key besides ``model``, ``role`` and ``llm_args`` (a table of the same) is one of the
arguments of TensorRT-LLM's ``LLM`` (``TorchLlmArgs`` field names: ``max_seq_len``,
``kv_cache_config``, ``guided_decoding_backend``...). Importing TensorRT-LLM takes seconds and
needs a GPU build, so the names are checked when the engine starts (``llm_args.llm_kwargs``).
Command-line flags arrive as strings (``--max-seq-len 512`` is ``max_seq_len="512"``; a nested
config is JSON text); values from ``plugins.toml`` keep their TOML types.
"""

from __future__ import annotations

from typing import Any, Literal

from openengine_gateway.spi import BackendSettings
from pydantic import ConfigDict, Field, model_validator


class TrtllmSettings(BackendSettings):
    """The TensorRT-LLM driver's options: ``model``, ``role`` and ``LLM`` arguments by name."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    role: Literal["aggregated", "prefill", "decode"] = "aggregated"
    """The engine's disaggregation role. TensorRT-LLM picks a request's phase per request
    (``DisaggregatedParams.request_type``); the gateway serves one role per engine, so prefill
    and decode engines need a ``cache_transceiver_config``."""

    llm_args: dict[str, Any] = Field(default_factory=dict)
    """``LLM`` arguments as one table (``[backends.trtllm] llm_args = {...}``)."""

    @model_validator(mode="after")
    def _no_duplicates(self) -> TrtllmSettings:
        extra = self.model_extra or {}
        twice = sorted(set(extra) & set(self.llm_args))
        if twice:
            raise ValueError(f"LLM arguments given twice (top level and llm_args): {', '.join(twice)}")
        if "model" in self.llm_args:
            raise ValueError("llm_args.model: give the model as the top-level 'model' option")
        return self

    @property
    def llm_options(self) -> dict[str, Any]:
        """Every ``LLM`` argument except ``model``, as given (strings from the command line)."""
        return {**self.llm_args, **(self.model_extra or {})}


__all__ = ["TrtllmSettings"]
