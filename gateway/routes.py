"""Which engine serves a request: every served name is a ``Route``.

An engine's name (and each alias) routes to that engine alone. A split's name (``[[splits]]``)
routes each request to one of several engines: by weight, or by the request's sticky key when it
has one, so that a conversation stays on one engine and keeps its prefix cache. A route may be
mirrored (``[[mirrors]]``): a share of its Generate requests is copied to a shadow engine.

A split advertises what every engine behind it accepts (``contract.intersection``), so a request
valid for the split is valid on whichever engine takes it. A ``RouteTable`` never changes; a
reload builds a new one and swaps it in whole, so a request sees one table from start to end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import pb
from .config import MirrorSection, SplitSection
from .contract.intersection import intersect_model_info, token_id_fields
from .errors import ConfigurationError, InvalidArgument, clip

if TYPE_CHECKING:
    from .engines import Engine


@dataclass(frozen=True, eq=False)
class Mirror:
    """Copies of a route's Generate requests to ``shadow`` (``core.mirror`` runs them)."""

    shadow: Engine
    share: float
    """The fraction of requests copied, 0 < share <= 1."""
    max_in_flight: int
    """Copies running at once; a request past it is not copied (shed)."""

    def sampled(self) -> bool:
        """Whether to copy this request."""
        return self.share >= 1.0 or random.random() < self.share


@dataclass(frozen=True, eq=False)
class Route:
    """What one served name reaches: one engine, or a weighted split of several."""

    name: str
    """The route's own name: the engine's served name, or the split's name."""
    engines: tuple[Engine, ...]
    weights: tuple[int, ...]
    model_info: pb.ModelInfo
    """What the name advertises, and what its requests are validated against."""
    sticky: tuple[str, ...] = ()
    """Where a request's sticky key is found (``config.STICKY_SOURCES``), the first present wins."""
    same_tokenizer: bool = True
    """Every engine reads token ids alike; otherwise a request holding token ids is refused."""
    mirror: Mirror | None = None
    _weighted: tuple[tuple[Engine, int], ...] = field(init=False, repr=False)
    """The engines that take requests (weight above 0), with their weights."""

    def __post_init__(self) -> None:
        weighted = tuple((engine, weight) for engine, weight in zip(self.engines, self.weights, strict=True) if weight)
        object.__setattr__(self, "_weighted", weighted)

    @property
    def is_split(self) -> bool:
        """Several engines serve the name."""
        return len(self.engines) > 1

    def pick(
        self,
        *,
        cache_salt: str | None = None,
        metadata: Mapping[str, str] | None = None,
        down: Container[str] = (),
    ) -> Engine:
        """The engine for one request: by its sticky key when it has one, else at random by weight;
        among the engines not ``down`` (served names) while any is up.

        A sticky key goes by weighted rendezvous hashing: each engine scores the key and the best
        score wins, so a weight change moves only the keys it must (a new engine takes keys from every
        other in proportion; an engine set to 0, or down, hands its keys to the rest, and gets them
        back when it returns).
        """
        if not self.is_split:
            return self.engines[0]
        weighted = self._weighted
        if down:
            weighted = tuple(pair for pair in weighted if pair[0].served_name not in down) or weighted
        key = self.sticky_key(cache_salt, metadata or {})
        if key is None:
            (engine,) = random.choices([pair[0] for pair in weighted], [pair[1] for pair in weighted])
            return engine
        return max(weighted, key=lambda pair: _rendezvous_score(key, pair[0].served_name, pair[1]))[0]

    def split_of(self, engine: Engine) -> str:
        """The split label of ``engine``'s requests through this route: the route's name when it is not the
        engine's own (a split, even of one engine), else ""."""
        return "" if self.name == engine.served_name else self.name

    def sticky_key(self, cache_salt: str | None, metadata: Mapping[str, str]) -> str | None:
        """The request's sticky key from the first of ``sticky``'s sources it has."""
        for source in self.sticky:
            value = cache_salt if source == "cache_salt" else metadata.get(source.removeprefix("metadata."))
            if value:
                return f"{source}={value}"
        return None

    def by_rank(self, rank: int) -> Engine:
        """The engine of the split that owns endpoint data-parallel rank ``rank``."""
        for engine in self.engines:
            if rank in engine.ranks.ranks:
                return engine
        raise InvalidArgument(
            f"kv.data_parallel_rank {rank} belongs to no engine of {clip(self.name)} "
            f"({', '.join(f'{e.served_name}: {list(e.ranks.ranks)}' for e in self.engines)})"
        )

    def check_token_ids(self, request: object) -> None:
        """Refuse a request that holds token ids when the route's engines read them differently."""
        if self.same_tokenizer:
            return
        fields = token_id_fields(request)  # type: ignore[arg-type]
        if fields:
            raise InvalidArgument(
                f"{clip(self.name)} is split across engines whose tokenizers differ, so token ids mean different "
                f"things on each; send text instead of {', '.join(fields)} (or address one engine by its own name)"
            )


def share_tokenizer(engines: Iterable[Engine]) -> bool:
    """The engines read token ids alike: each reports one and the same ``tokenizer_id`` (unknown is different)."""
    tokenizers = {engine.facts.tokenizer_id for engine in engines}
    return len(tokenizers) == 1 and None not in tokenizers


def _rendezvous_score(key: str, engine: str, weight: int) -> float:
    """Weighted rendezvous hashing's score: ``-weight / ln(u)`` with ``u`` uniform in (0, 1) from the hash."""
    digest = hashlib.blake2b(f"{key}\0{engine}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)
    return -weight / math.log(unit)


@dataclass(frozen=True)
class RoutePlan:
    """What ``[[splits]]`` and ``[[mirrors]]`` name, checked by name alone: each split's engines and each
    mirror's route and shadow, by served name. ``plan_routes`` needs no running engine, so a typo is
    reported before any engine starts; ``RouteTable`` then checks what only started engines tell."""

    splits: tuple[tuple[SplitSection, tuple[str, ...]], ...]
    mirrors: tuple[tuple[MirrorSection, str, str], ...]
    """(section, the mirrored route's name, the shadow's served name)."""


def plan_routes(
    engine_names: Mapping[str, str], splits: Sequence[SplitSection], mirrors: Sequence[MirrorSection]
) -> RoutePlan:
    """Resolve the sections' names against ``engine_names`` (each engine's served name and aliases ->
    its served name). A ``ConfigurationError`` names the entry (``splits[1]``, ``mirrors[0]``): an
    unknown engine, an engine listed twice, a name served twice, a mirror of no served name or of a
    route mirrored already, a shadow that is no engine or is the route's only engine (a split's own engine may
    be its shadow: it gets copies of the requests the split's other engines answer, as a canary's agreement
    needs)."""
    routes: dict[str, str] = dict(engine_names)
    """Every served name -> its route's name."""
    members: dict[str, tuple[str, ...]] = {served: (served,) for served in engine_names.values()}
    planned_splits: list[tuple[SplitSection, tuple[str, ...]]] = []
    for position, split in enumerate(splits):
        label = f"splits[{position}] ({split.name})"
        engines: list[str] = []
        for name in split.engines:
            served = engine_names.get(name)
            if served is None:
                raise ConfigurationError(
                    f"{label}: no engine is served as {name!r} (engines: {', '.join(engine_names)})"
                )
            if served in engines:
                raise ConfigurationError(f"{label}: engine {served!r} is listed twice")
            engines.append(served)
        analysis = split.analysis
        if analysis is not None:
            sides = [engine_names.get(analysis.baseline), engine_names.get(analysis.candidate)]
            if any(side not in engines for side in sides) or sides[0] == sides[1]:
                raise ConfigurationError(
                    f"{label}: analysis: baseline {analysis.baseline!r} and candidate {analysis.candidate!r} must be "
                    f"two engines of the split ({', '.join(engines)})"
                )
        for name in (split.name, *split.aliases):
            if name in routes:
                raise ConfigurationError(f"splits[{position}]: model name {name!r} is served twice")
            routes[name] = split.name
        members[split.name] = tuple(engines)
        planned_splits.append((split, tuple(engines)))
    planned_mirrors: list[tuple[MirrorSection, str, str]] = []
    for position, section in enumerate(mirrors):
        label = f"mirrors[{position}] ({section.name} -> {section.shadow})"
        route = routes.get(section.name)
        if route is None:
            raise ConfigurationError(f"{label}: {section.name!r} is not a served name ({', '.join(routes)})")
        if any(planned[1] == route for planned in planned_mirrors):
            raise ConfigurationError(f"{label}: {route!r} is mirrored twice")
        shadow = engine_names.get(section.shadow)
        if shadow is None:
            raise ConfigurationError(
                f"{label}: no engine is served as {section.shadow!r} (engines: {', '.join(engine_names)})"
            )
        if members[route] == (shadow,):
            raise ConfigurationError(f"{label}: the shadow {shadow!r} already serves {route!r}")
        planned_mirrors.append((section, route, shadow))
    return RoutePlan(tuple(planned_splits), tuple(planned_mirrors))


class RouteTable:
    """Every served name's route, built from the engines and the ``[[splits]]``/``[[mirrors]]`` sections.

    Validated whole before it is used: the names (``plan_routes``), then what the engines report: a
    split's engines share a role, and a mirror's engines and shadow are aggregated (a prefill or decode
    copy would hold or pull a KV session a second time).
    """

    def __init__(
        self, engines: Sequence[Engine], splits: Sequence[SplitSection] = (), mirrors: Sequence[MirrorSection] = ()
    ) -> None:
        self.splits = tuple(splits)
        self.mirrors = tuple(mirrors)
        plan = plan_routes({name: e.served_name for e in engines for name in e.names}, splits, mirrors)
        by_served = {engine.served_name: engine for engine in engines}
        routes: dict[str, Route] = {}
        for engine in engines:
            routes.update(dict.fromkeys(engine.names, Route(engine.served_name, (engine,), (1,), engine.model_info)))
        for position, (split, members) in enumerate(plan.splits):
            route = _split_route(split, [by_served[name] for name in members], f"splits[{position}] ({split.name})")
            routes.update(dict.fromkeys((split.name, *split.aliases), route))
        for position, (section, name, shadow_name) in enumerate(plan.mirrors):
            route, shadow = routes[name], by_served[shadow_name]
            _check_aggregated((*route.engines, shadow), f"mirrors[{position}] ({section.name} -> {section.shadow})")
            mirrored = _mirrored(route, shadow, section)
            routes.update({key: mirrored for key, held in routes.items() if held is route})
        self._routes = routes

    def get(self, name: str) -> Route | None:
        """The route of a served name or alias."""
        return self._routes.get(name)

    @property
    def names(self) -> list[str]:
        """Every served name and alias: the engines' in configuration order, then the splits'."""
        return list(self._routes)

    def routes(self) -> list[Route]:
        """Each route once, in the order of ``names``."""
        return list({id(route): route for route in self._routes.values()}.values())


def _split_route(split: SplitSection, engines: Sequence[Engine], label: str) -> Route:
    roles = {engine.role for engine in engines}
    if len(roles) > 1:
        named = ", ".join(f"{e.served_name}: {pb.EngineRole.Name(e.role)}" for e in engines)
        raise ConfigurationError(f"{label}: a split's engines must share one role ({named})")
    same_tokenizer = len(engines) == 1 or share_tokenizer(engines)
    info = intersect_model_info([engine.model_info for engine in engines], same_tokenizer=same_tokenizer)
    info.served_model_name = split.name
    info.served_model_aliases.extend(split.aliases)
    if not info.model_id:
        info.model_id = split.name
    return Route(
        split.name,
        tuple(engines),
        tuple(split.engines.values()),
        info,
        sticky=tuple(split.sticky),
        same_tokenizer=same_tokenizer,
    )


def _check_aggregated(engines: Sequence[Engine], label: str) -> None:
    for engine in engines:
        if engine.role != pb.ENGINE_ROLE_AGGREGATED:
            raise ConfigurationError(
                f"{label}: {engine.served_name!r} is a {pb.EngineRole.Name(engine.role)} engine; only aggregated "
                "engines are mirrored (a copy would hold or pull a KV session a second time)"
            )


def _mirrored(route: Route, shadow: Engine, section: MirrorSection) -> Route:
    return dataclasses.replace(route, mirror=Mirror(shadow, section.percent / 100.0, section.max_in_flight))


__all__ = ["Mirror", "Route", "RoutePlan", "RouteTable", "plan_routes", "share_tokenizer"]
