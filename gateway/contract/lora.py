"""The LoRA adapter registry: names, ids and paths, with the contract's lifecycle rules.

The gateway owns the name ↔ id ↔ path mapping (some engines list adapters by id only), so
every driver gets the same semantics:

* ``lora_id`` is positive, ``lora_name`` non-empty, ``source_path`` an absolute directory
  (symlinks resolved; no NUL, which no path can hold) inside the operator's allowed roots
  when those are configured. Only an engine that shares the gateway's filesystem has its
  paths resolved and checked here; another host's paths are only normalized (``..``, ``//``
  and trailing slashes), and that engine checks them itself;
* loading the same id, name and path again is idempotent (``already_loaded``), adapters the
  engine started with included: their paths are normalized the same way;
* a conflicting id, name or path is ALREADY_EXISTS; an unknown name is NOT_FOUND.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path

from .. import pb
from ..errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, clip
from ..spi.requests import LoraAdapter


def adapter_to_proto(adapter: LoraAdapter) -> pb.LoraAdapter:
    """The wire form of a registered adapter."""
    return pb.LoraAdapter(lora_id=adapter.lora_id, lora_name=adapter.lora_name, source_path=adapter.source_path)


class LoraRegistry:
    """Registered adapters by name, in load order."""

    def __init__(self, allowed_roots: Sequence[str] = ()) -> None:
        self._allowed = tuple(Path(os.path.realpath(root)) for root in allowed_roots)
        self._by_name: dict[str, LoraAdapter] = {}

    def seed(self, adapters: Iterable[LoraAdapter], *, local: bool = True) -> None:
        """Adapters an engine was started with (``local``: it shares the gateway's filesystem)."""
        for adapter in adapters:
            path = adapter.source_path
            if os.path.isabs(path) and "\0" not in path:
                adapter = LoraAdapter(adapter.lora_id, adapter.lora_name, _normalized(path, local=local))
            self._by_name[adapter.lora_name] = adapter

    def resolve(self, requested: pb.LoraAdapter, *, local: bool = True) -> tuple[LoraAdapter, bool]:
        """Validate a load request: the adapter to load, and whether it is already loaded.

        ``local``: the engines share the gateway's filesystem, so the path is resolved and must
        be a directory here.
        """
        if requested.lora_id <= 0:
            raise InvalidArgument("adapter.lora_id must be positive")
        if not requested.lora_name:
            raise InvalidArgument("adapter.lora_name must be non-empty")
        path = requested.source_path
        if not path or not os.path.isabs(path) or "\0" in path:
            raise InvalidArgument("adapter.source_path must be an absolute directory path")
        real = Path(_normalized(path, local=local))
        if self._allowed and not any(real.is_relative_to(root) for root in self._allowed):
            raise PermissionDenied("adapter.source_path is outside the directories this gateway allows")
        if local and not _is_dir(real):
            raise InvalidArgument("adapter.source_path is not a directory visible to the engine")
        adapter = LoraAdapter(requested.lora_id, requested.lora_name, str(real))
        existing = self._by_name.get(adapter.lora_name)
        if existing == adapter:
            return adapter, True
        if existing is not None:
            raise AlreadyExists(f"a different adapter is loaded as {clip(adapter.lora_name)}")
        for other in self._by_name.values():
            if other.lora_id == adapter.lora_id:
                raise AlreadyExists(f"lora_id {adapter.lora_id} is in use by {clip(other.lora_name)}")
            if other.source_path == adapter.source_path:
                raise AlreadyExists(f"that source_path is already loaded as {clip(other.lora_name)}")
        return adapter, False

    def add(self, adapter: LoraAdapter) -> None:
        """Record a loaded adapter."""
        self._by_name[adapter.lora_name] = adapter

    def get(self, name: str) -> LoraAdapter:
        """The adapter registered as ``name``; NOT_FOUND otherwise."""
        adapter = self._by_name.get(name)
        if adapter is None:
            raise NotFound(f"no LoRA adapter named {clip(name)} is loaded")
        return adapter

    def remove(self, name: str) -> LoraAdapter:
        """Forget an adapter; NOT_FOUND when unknown."""
        adapter = self.get(name)
        del self._by_name[name]
        return adapter

    def adapters(self) -> list[LoraAdapter]:
        """Every registered adapter, in load order."""
        return list(self._by_name.values())


def _normalized(path: str, *, local: bool) -> str:
    """An absolute path in the form the registry compares: symlinks resolved where the files are
    the gateway's own, only ``..``, ``//`` and trailing slashes folded where they are another host's."""
    return os.path.realpath(path) if local else posixpath.normpath(path)


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory; a path the OS refuses to look up (a name too long) is not."""
    try:
        return path.is_dir()
    except OSError:
        return False


__all__ = ["LoraRegistry", "adapter_to_proto"]
