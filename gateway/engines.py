"""The engines this process serves, and the names that reach them.

An ``Engine`` is a started backend plus what it advertised. ``EngineSet`` routes a request's
``model`` to its ``routes.Route`` (an engine's name, an alias, or a split of several engines):
an unknown name is NOT_FOUND; an empty name is allowed only where the contract does not require
one and exactly one engine is served.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import pb
from .config import MirrorSection, SplitSection
from .contract.capabilities import check_model_info
from .contract.ranks import RankSpan, shared_spans
from .core.driver_faults import DriverFaults
from .errors import ConfigurationError, InvalidArgument, NotFound, clip
from .routes import Route, RouteTable
from .spi.backend import Backend, EngineFacts


def check_exclusive(backends: Sequence[tuple[str, Backend[Any]]]) -> None:
    """Refuse to serve an engine that needs its process to itself beside another engine.

    ``backends`` pairs each engine's label (as errors name it) with its driver; the check runs
    before any engine starts, so nothing is left half started.
    """
    if len(backends) < 2:
        return
    for label, backend in backends:
        if backend.process_exclusive:
            raise ConfigurationError(
                f"{label}: a {backend.name} engine must be the only engine of its gateway "
                f"({backend.process_exclusive}); serve it from a gateway of its own and join the gateways "
                "with the `remote` backend (docs/multi-engine.md)"
            )


@dataclass(eq=False)
class Engine:
    """A started backend serving one model under a name and optional aliases."""

    served_name: str
    aliases: tuple[str, ...]
    backend: Backend[Any]
    facts: EngineFacts
    model_info: pb.ModelInfo = field(init=False)
    ranks: RankSpan = field(init=False)
    """The engine's place in the endpoint's data-parallel rank space (set by ``EngineSet``)."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    faults: DriverFaults = field(init=False)
    """The driver's mistakes at request time (``core.driver_faults``)."""

    def __post_init__(self) -> None:
        self.faults = DriverFaults(self.backend.name or type(self.backend).__name__)
        check_model_info(self.facts.model)
        info = pb.ModelInfo()
        info.CopyFrom(self.facts.model)
        if not info.model_id:
            info.model_id = self.backend.settings.model or self.served_name
        info.served_model_name = self.served_name
        del info.served_model_aliases[:]
        info.served_model_aliases.extend(self.aliases)
        self.model_info = info
        self.ranks = RankSpan.of(self.facts.parallelism)
        if not self.facts.instance_id:
            self.facts.instance_id = uuid.uuid4().hex

    @property
    def role(self) -> pb.EngineRole.ValueType:
        """The engine's ``EngineRole``."""
        return self.facts.role

    @property
    def names(self) -> tuple[str, ...]:
        """The served name first, then the aliases."""
        return (self.served_name, *self.aliases)


class EngineSet:
    """Every served engine, with routing by model name and one data-parallel rank space.

    Several engines take consecutive blocks of the endpoint's ranks in configuration order
    (``contract.ranks``), so KV events, per-rank load and request ranks stay attributable. The
    names (engines', aliases, splits') and mirrors are a ``RouteTable`` that ``reroute`` replaces
    while serving; the engines themselves never change.
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ConfigurationError("no engine is configured")
        self._engines = list(engines)
        self._by_name: dict[str, Engine] = {}
        for engine in self._engines:
            for name in engine.names:
                if not name:
                    raise ConfigurationError("a served model name must be non-empty")
                if name in self._by_name:
                    raise ConfigurationError(f"model name {name!r} is served twice")
                self._by_name[name] = engine
        spans = shared_spans([engine.facts.parallelism for engine in self._engines])
        for engine, span in zip(self._engines, spans, strict=True):
            engine.ranks = span
        self.routes = RouteTable(self._engines)

    def __iter__(self) -> Iterator[Engine]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    def reroute(self, splits: Sequence[SplitSection], mirrors: Sequence[MirrorSection]) -> RouteTable:
        """Serve these splits and mirrors from now on (validated first: a ``ConfigurationError``
        changes nothing). Requests already routed keep their engine."""
        self.routes = RouteTable(self._engines, splits, mirrors)
        return self.routes

    @property
    def served_names(self) -> list[str]:
        """Every served model name and alias, in configuration order (engines, then splits)."""
        return self.routes.names

    def route(self, model: str, *, required: bool = False) -> Route:
        """The route of ``model``; an empty name means the only engine when allowed."""
        if not model:
            if required:
                raise InvalidArgument("model is required")
            if len(self._engines) == 1:
                return self.route(self._engines[0].served_name)
            raise InvalidArgument(f"model is required: this gateway serves {self.served_names}")
        route = self.routes.get(model)
        if route is None:
            raise NotFound(f"model {clip(model)} is not served here; served models: {self.served_names}")
        return route

    def engine(self, name: str) -> Engine:
        """The engine served as ``name`` (its served name or an alias), never a split."""
        engine = self._by_name.get(name)
        if engine is None:
            raise NotFound(f"no engine is served as {clip(name)}")
        return engine


__all__ = ["Engine", "EngineSet", "check_exclusive"]
