"""The LoRA adapters loaded in vLLM, as the ``LoRARequest`` each request names them by."""

from __future__ import annotations

from typing import Any

from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import LoadedAdapters, LoraAdapter


class VllmAdapters:
    """``AsyncLLM.add_lora`` / ``remove_lora``; the gateway's registry owns names and ids."""

    def __init__(self) -> None:
        self._loaded: LoadedAdapters[Any] = LoadedAdapters("the vLLM engine")

    def find(self, name: str | None) -> Any:
        """The ``LoRARequest`` a request names (None for the base model); ``NotFound`` unless loaded."""
        return self._loaded.find(name)

    async def load(self, engine: Any, adapter: LoraAdapter) -> None:
        """Load ``adapter`` into ``engine``; ``InvalidArgument`` when vLLM cannot."""
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(adapter.lora_name, adapter.lora_id, adapter.source_path)
        try:
            loaded = await engine.add_lora(lora)
        except Exception as exc:  # broad on purpose: vLLM raises many kinds for a bad adapter
            raise InvalidArgument(f"vLLM could not load adapter {adapter.lora_name!r}: {exc}") from None
        if not loaded:
            raise InvalidArgument(f"vLLM did not load adapter {adapter.lora_name!r}")
        self._loaded.add(adapter.lora_name, lora)

    async def unload(self, engine: Any, adapter: LoraAdapter) -> None:
        """Stop serving ``adapter`` and remove it from ``engine`` by its id."""
        self._loaded.remove(adapter.lora_name)
        await engine.remove_lora(adapter.lora_id)


__all__ = ["VllmAdapters"]
