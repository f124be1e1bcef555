"""LoadLora, UnloadLora and ListLoras over the gateway's adapter registry."""

from __future__ import annotations

import asyncio

from .. import pb
from ..contract.bounds import DEFAULT_BOUNDS, FieldBounds, check_lora_fields
from ..contract.lora import LoraRegistry, adapter_to_proto
from ..engines import Engine, EngineSet
from ..errors import FailedPrecondition, InvalidArgument, PermissionDenied, clip
from .audit import audit


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
                    await engine.backend.load_lora(adapter)
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
                await engine.backend.unload_lora(adapter)
            self._registry.remove(adapter.lora_name)
        return pb.UnloadLoraResponse(adapter=adapter_to_proto(adapter))

    def list(self, request: pb.ListLorasRequest) -> pb.ListLorasResponse:
        """Every loaded adapter, in load order."""
        self._lora_engines()
        return pb.ListLorasResponse(adapters=[adapter_to_proto(a) for a in self._registry.adapters()])


__all__ = ["LoraService"]
