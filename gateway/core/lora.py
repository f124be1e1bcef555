"""The LoRA adapter registry, and LoadLora, UnloadLora and ListLoras over it.

The gateway owns the name ↔ id ↔ path mapping (some engines list adapters by id only), so
every driver gets the same semantics:

* a request passes the contract's rules (``contract.lora.check_adapter``), and its
  ``source_path`` is a directory (symlinks resolved) inside the operator's allowed roots when
  those are configured. Only an engine that shares the gateway's filesystem has its paths
  resolved and checked here; another host's paths are only normalized (``..``, ``//`` and
  trailing slashes), and that engine checks them itself;
* loading the same id, name and path again is idempotent (``already_loaded``), adapters the
  engine started with included: their paths are normalized the same way;
* a conflicting id, name or path is ALREADY_EXISTS; an unknown name is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path

from .. import pb
from ..contract.bounds import DEFAULT_BOUNDS, FieldBounds, check_lora_fields
from ..contract.lora import adapter_to_proto, check_adapter, is_absolute_path
from ..engines import Engine, EngineSet
from ..errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, clip
from ..spi.requests import LoraAdapter
from .audit import audit
from .driver_faults import awaited


class LoraRegistry:
    """Registered adapters by name, in load order."""

    def __init__(self, allowed_roots: Sequence[str] = ()) -> None:
        self._allowed = tuple(Path(os.path.realpath(root)) for root in allowed_roots)
        self._by_name: dict[str, LoraAdapter] = {}

    def seed(self, adapters: Iterable[LoraAdapter], *, local: bool = True) -> None:
        """Adapters an engine was started with (``local``: it shares the gateway's filesystem)."""
        for adapter in adapters:
            path = adapter.source_path
            if is_absolute_path(path):
                adapter = LoraAdapter(adapter.lora_id, adapter.lora_name, _normalized(path, local=local))
            self._by_name[adapter.lora_name] = adapter

    def resolve(self, requested: pb.LoraAdapter, *, local: bool = True) -> tuple[LoraAdapter, bool]:
        """Validate a load request: the adapter to load, and whether it is already loaded.

        ``local``: the engines share the gateway's filesystem, so the path is resolved and must
        be a directory here.
        """
        check_adapter(requested)
        real = Path(_normalized(requested.source_path, local=local))
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


class LoraService:
    """Applies adapter lifecycle calls to every engine that advertises LoRA."""

    def __init__(self, engines: EngineSet, registry: LoraRegistry, *, bounds: FieldBounds = DEFAULT_BOUNDS) -> None:
        self._engines = engines
        self._bounds = bounds
        self._registry = registry
        self._lock = asyncio.Lock()
        for engine in engines:
            registry.seed(engine.facts.lora_adapters, local=engine.facts.shares_filesystem)

    def _lora_engines(self) -> list[Engine]:
        engines = [e for e in self._engines if e.model_info.HasField("supports_lora") and e.model_info.supports_lora]
        if not engines:
            raise FailedPrecondition("LoRA is not enabled on any engine behind this gateway")
        return engines

    async def load(self, request: pb.LoadLoraRequest) -> pb.LoadLoraResponse:
        """Load an adapter everywhere it can be served; idempotent for the same adapter."""
        audit(f"LoadLora of {clip(request.adapter.lora_name)} from {clip(request.adapter.source_path)}")
        check_lora_fields(request.adapter.lora_name, request.adapter.source_path, self._bounds)
        engines = self._lora_engines()
        if not request.HasField("adapter"):
            raise InvalidArgument("adapter is required")
        # One engine reading this host's files is enough for the path to have to exist here.
        local = any(engine.facts.shares_filesystem for engine in engines)
        async with self._lock:
            try:
                adapter, already = self._registry.resolve(request.adapter, local=local)
            except PermissionDenied as refused:
                audit(f"PERMISSION_DENIED on LoadLora: {refused.message}")
                raise
            if not already:
                for engine in engines:
                    await awaited(engine.faults, "load_lora", engine.backend.load_lora(adapter))
                self._registry.add(adapter)
        return pb.LoadLoraResponse(adapter=adapter_to_proto(adapter), already_loaded=already)

    async def unload(self, request: pb.UnloadLoraRequest) -> pb.UnloadLoraResponse:
        """Unload an adapter by name."""
        audit(f"UnloadLora of {clip(request.lora_name)}")
        check_lora_fields(request.lora_name, "", self._bounds)
        engines = self._lora_engines()
        if not request.lora_name:
            raise InvalidArgument("lora_name is required")
        async with self._lock:
            adapter = self._registry.get(request.lora_name)
            for engine in engines:
                await awaited(engine.faults, "unload_lora", engine.backend.unload_lora(adapter))
            self._registry.remove(adapter.lora_name)
        return pb.UnloadLoraResponse(adapter=adapter_to_proto(adapter))

    def list(self, request: pb.ListLorasRequest) -> pb.ListLorasResponse:
        """Every loaded adapter, in load order."""
        self._lora_engines()
        return pb.ListLorasResponse(adapters=[adapter_to_proto(a) for a in self._registry.adapters()])


__all__ = ["LoraRegistry", "LoraService"]
