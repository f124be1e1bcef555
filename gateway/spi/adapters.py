"""The LoRA adapters loaded in an engine, by name: what a request's ``lora_name`` resolves to.

The gateway's registry checks names and ids before it calls ``load_lora`` and before a request
reaches the driver; this table is the driver's side of it, holding each adapter as the engine's
own handle (vLLM's ``LoRARequest``, the mock's ``LoraAdapter``...), so that a request naming an
adapter the engine no longer holds (an unload racing the request) is ``NotFound``, not a failure
inside the engine.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ..errors import NotFound

T = TypeVar("T")


class LoadedAdapters(Generic[T]):
    """Adapter handles by adapter name; ``engine`` names the engine in errors ("the vLLM engine")."""

    def __init__(self, engine: str) -> None:
        self._engine = engine
        self._handles: dict[str, T] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def add(self, name: str, handle: T) -> None:
        """Serve ``name`` through ``handle``."""
        self._handles[name] = handle

    def remove(self, name: str) -> T | None:
        """Stop serving ``name``; its handle, or None when it was not loaded."""
        return self._handles.pop(name, None)

    def find(self, name: str | None) -> T | None:
        """The handle of the adapter a request names; None for the base model (no name).

        Raises ``NotFound`` when no adapter of that name is loaded.
        """
        if name is None:
            return None
        handle = self._handles.get(name)
        if handle is None:
            raise NotFound(f"no LoRA adapter named {name!r} is loaded in {self._engine}")
        return handle


__all__ = ["LoadedAdapters"]
