"""The adapters a TensorRT-LLM engine serves, by name, and the ids it has bound: pure bookkeeping.

TensorRT-LLM loads adapters lazily, by id, into a cache it never flushes on request: an id stays
bound to its first adapter for the engine's life, and an evicted adapter is reloaded from its
path when a request names it again, so a request naming an adapter whose files are gone fails
before submission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openengine_gateway.errors import AlreadyExists, FailedPrecondition
from openengine_gateway.spi import LoadedAdapters, LoraAdapter


class LoraRegistry:
    """``LoRARequest`` objects by adapter name, and the (name, path) each id was first bound to."""

    def __init__(self) -> None:
        self._requests: LoadedAdapters[Any] = LoadedAdapters("the TensorRT-LLM engine")
        self._ids: dict[int, tuple[str, str]] = {}

    def check_id(self, adapter: LoraAdapter) -> None:
        """``AlreadyExists`` when the adapter's id was bound to another adapter."""
        used = self._ids.get(adapter.lora_id)
        if used is not None and used != (adapter.lora_name, adapter.source_path):
            raise AlreadyExists(
                f"lora_id {adapter.lora_id} was {used[0]!r}; TensorRT-LLM may still cache its weights under that id"
            )

    def add(self, adapter: LoraAdapter, request: Any) -> None:
        """Serve ``adapter`` through its ``LoRARequest`` ``request``, binding its id."""
        self._ids[adapter.lora_id] = (adapter.lora_name, adapter.source_path)
        self._requests.add(adapter.lora_name, request)

    def remove(self, name: str) -> None:
        """Stop serving ``name`` (its id stays bound)."""
        self._requests.remove(name)

    def request(self, name: str | None) -> Any:
        """The adapter's ``LoRARequest`` (None for the base model); ``NotFound`` unless served,
        ``FailedPrecondition`` if its files are gone."""
        request = self._requests.find(name)
        if request is None:
            return None
        if not Path(request.lora_path).exists():
            raise FailedPrecondition(f"LoRA adapter {name!r}: {request.lora_path} no longer exists")
        return request


__all__ = ["LoraRegistry"]
