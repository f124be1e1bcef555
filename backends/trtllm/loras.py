"""The adapters a TensorRT-LLM engine serves, by name, and the ids it has bound: pure bookkeeping.

TensorRT-LLM loads adapters lazily, by id, into a cache it never flushes on request: an id stays
bound to its first adapter for the engine's life, and an evicted adapter is reloaded from its
path when a request names it again, so a request naming an adapter whose files are gone fails
before submission. TensorRT-LLM 1.2.1's worker loads an adapter outside its ``RequestError``
wrapper (``executor/base_worker.py``, ``_enqueue_request``), so an adapter that fails to load
ends the whole engine, not one request (1.3 wraps it): ``check_adapter`` refuses what it can
see is unloadable before anything reaches the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openengine_gateway.errors import AlreadyExists, FailedPrecondition, InvalidArgument
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
        ``FailedPrecondition`` if its files are gone (1.2.1 reloads it, and a failed load ends its worker)."""
        request = self._requests.find(name)
        if request is None:
            return None
        if not (Path(request.lora_path) / "adapter_config.json").exists():
            raise FailedPrecondition(f"LoRA adapter {name!r}: {request.lora_path} holds no adapter_config.json now")
        return request


def check_adapter(name: str, path: str, max_rank: int | None) -> None:
    """``InvalidArgument`` for a Hugging Face adapter TensorRT-LLM could not load: no readable
    ``adapter_config.json``, or a rank above the engine's ``max_lora_rank``."""
    config_path = Path(path) / "adapter_config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"LoRA adapter {name!r}: no readable {config_path} ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"LoRA adapter {name!r}: {config_path} is not a JSON object")
    rank = config.get("r")
    if max_rank is not None and isinstance(rank, int) and rank > max_rank:
        raise InvalidArgument(f"LoRA adapter {name!r} has rank {rank}; the engine's lora_config takes {max_rank}")


__all__ = ["LoraRegistry", "check_adapter"]
