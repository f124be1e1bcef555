"""``SglangSettings``: the model to serve plus any SGLang server argument, validated without SGLang.

Every key besides ``model`` is one of SGLang's server arguments by its ``ServerArgs`` field name
(``context_length``, ``page_size``, ``enable_lora``, ``disaggregation_mode``...). Importing SGLang
takes seconds and needs CUDA, so names and values are checked when the engine starts
(``server_args.server_kwargs``), where an unknown name is an error that names it. Command-line
flags arrive as strings (``--context-length 4096`` is ``context_length="4096"``) and are
converted by SGLang's own argument parser; values from ``plugins.toml`` keep their TOML types.
"""

from __future__ import annotations

from typing import Any

from openengine_gateway.spi import BackendSettings
from pydantic import ConfigDict, model_validator


class SglangSettings(BackendSettings):
    """The SGLang driver's options: ``model`` and SGLang server arguments by their field names."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    @model_validator(mode="after")
    def _model_once(self) -> SglangSettings:
        if "model_path" in (self.model_extra or {}):
            raise ValueError("model_path: give the model as the 'model' option (SGLang's model_path)")
        return self

    @property
    def server_options(self) -> dict[str, Any]:
        """Every server argument except the model, as given (strings from the command line)."""
        return dict(self.model_extra or {})


__all__ = ["SglangSettings"]
