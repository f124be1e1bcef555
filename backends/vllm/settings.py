"""``VllmSettings``: the model to serve plus any vLLM engine argument, validated without vLLM.

Every key besides ``model`` (and ``engine_args``, a table of the same) is one of vLLM's engine
arguments (``AsyncEngineArgs`` field names: ``max_model_len``, ``enforce_eager``,
``kv_events_config``...). Importing vLLM takes seconds, so the names and values are checked
when the engine starts (``engine.engine_kwargs``), where an unknown name is an error that
names it. Command-line flags arrive as strings (``--max-model-len 512`` is
``max_model_len="512"``) and are converted by vLLM's own argument parser; values from
``plugins.toml`` keep their TOML types.
"""

from __future__ import annotations

from typing import Any

from openengine_gateway.spi import BackendSettings
from pydantic import ConfigDict, Field, model_validator


class VllmSettings(BackendSettings):
    """The vLLM driver's options: ``model`` and vLLM engine arguments by their field names."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Engine arguments as one table (``[backends.vllm] engine_args = {...}``)."""

    @model_validator(mode="after")
    def _no_duplicates(self) -> VllmSettings:
        extra = self.model_extra or {}
        twice = sorted(set(extra) & set(self.engine_args))
        if twice:
            raise ValueError(f"engine arguments given twice (top level and engine_args): {', '.join(twice)}")
        if "model" in self.engine_args:
            raise ValueError("engine_args.model: give the model as the top-level 'model' option")
        return self

    @property
    def engine_options(self) -> dict[str, Any]:
        """Every engine argument except ``model``, as given (strings from the command line)."""
        return {**self.engine_args, **(self.model_extra or {})}


__all__ = ["VllmSettings"]
