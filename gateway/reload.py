"""Changing splits and mirrors while serving: one reload path for SIGHUP and the ``ReloadRoutes`` RPC.

A reload re-reads the configuration file the gateway was started with and hands its ``[[splits]]``
and ``[[mirrors]]`` to ``reroute``, which validates them against the running engines and swaps
the routes at once, or raises and changes nothing. Engines start only at startup, so a file whose
``[[engines]]``, ``[backends]`` or ``[plugins]`` changed while the gateway serves the file's
engines is refused whole: applying its routes would pretend the rest applied too. A gateway whose
engine came from the command line (``--backend``) reads only the file's routes. Every reload,
applied or refused, is one audit line naming who asked (a token, or ``SIGHUP from the operator``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .config import AnalysisSection, Config, MirrorSection, SplitSection, load_config
from .core.audit import audit
from .core.callers import Caller
from .errors import ConfigurationError

log = logging.getLogger(__name__)
_Section = TypeVar("_Section", SplitSection, MirrorSection)


class RouteSections(Protocol):
    """The routes a gateway serves (``routes.RouteTable``), as the sections they were built from."""

    @property
    def splits(self) -> tuple[SplitSection, ...]: ...

    @property
    def mirrors(self) -> tuple[MirrorSection, ...]: ...


class Routed(Protocol):
    """What a reload needs of the gateway: its routes, and the validated swap of them."""

    @property
    def routes(self) -> RouteSections: ...

    def reroute(self, splits: Sequence[SplitSection], mirrors: Sequence[MirrorSection]) -> RouteSections: ...


@dataclass(frozen=True, slots=True)
class SignalCaller(Caller):
    """A reload asked for by a signal: Python cannot tell who sent it, only that it came from this machine."""

    signal: str = "SIGHUP"

    def describe(self) -> str:
        return f"{self.signal} from the operator"


@dataclass(frozen=True)
class Reloaded:
    """An applied reload: the routes now served and what changed, one line each."""

    routes: RouteSections
    changes: tuple[str, ...]

    @property
    def summary(self) -> str:
        """The changes on one line, or ``no change``."""
        return "; ".join(self.changes) or "no change"


class RouteReloader:
    """Reloads ``gateway``'s routes from ``config_file``, which it was started with as ``started``
    (None: started without a file, so every reload is refused); ``command_line``: its engine came
    from ``--backend``, not from the file."""

    def __init__(self, gateway: Routed, config_file: Path | None, started: Config, *, command_line: bool) -> None:
        self.gateway = gateway
        self._file = config_file.absolute() if config_file is not None else None
        self._started = started
        self._command_line = command_line

    def reload(self, caller: Caller) -> Reloaded:
        """Apply the file's splits and mirrors; raises ``ConfigurationError`` saying why not, having
        changed nothing. Either way one audit line records it, by ``caller``."""
        source = f"reload of routes from {self._file}" if self._file is not None else "reload of routes"
        try:
            reloaded = self._apply()
        except ConfigurationError as exc:
            audit(f"{source} refused: {_one_line(str(exc))}", caller)
            raise
        audit(f"{source}: {reloaded.summary}", caller)
        return reloaded

    def _apply(self) -> Reloaded:
        if self._file is None:
            raise ConfigurationError(
                "the gateway was started without a configuration file, so it has no routes to reload; "
                "start it with --config FILE (or a ./plugins.toml) holding [[splits]] and [[mirrors]]"
            )
        config = load_config(self._file)
        if not self._command_line:
            needs_restart = restart_changes(self._started, config)
            if needs_restart:
                raise ConfigurationError(
                    f"{self._file}: changed since the gateway started: {', '.join(needs_restart)}; engines start "
                    "only at startup, so restart the gateway to apply that, or undo it to reload the routes"
                )
        before = self.gateway.routes
        after = self.gateway.reroute(config.splits, config.mirrors)
        return Reloaded(after, (*route_changes(before, after), *self._restart_notes(config)))

    def _restart_notes(self, config: Config) -> tuple[str, ...]:
        """A line for ``[gateway]`` keys changed in the file: read at startup only, so not applied."""
        keys = _changed_keys(self._started.gateway.model_dump(), config.gateway.model_dump())
        return (f"[gateway] {', '.join(keys)} changed: not applied, read at the next start",) if keys else ()


class HangupReload:
    """The SIGHUP handler: reload, and on a refusal log why and keep serving the old routes.

    The signal's handler is installed before the engines start, since SIGHUP's default action ends
    the process; a SIGHUP that comes before the gateway serves is applied once it does (``serving``).
    """

    def __init__(self) -> None:
        self._reloader: RouteReloader | None = None
        self._pending = False

    def __call__(self) -> None:
        reloader = self._reloader
        if reloader is None:
            self._pending = True
            log.info("SIGHUP while starting: the routes will be reloaded once the gateway serves")
            return
        try:
            reloader.reload(SignalCaller())  # its audit line is the record of an applied reload
        except ConfigurationError as exc:
            log.warning("SIGHUP: routes not reloaded, the old ones still serve: %s", exc)

    def serving(self, reloader: RouteReloader) -> None:
        """From now on a SIGHUP reloads with ``reloader``; one received while starting does now."""
        self._reloader = reloader
        if self._pending:
            self._pending = False
            self()


def restart_changes(started: Config, now: Config) -> list[str]:
    """What of the engines' configuration differs between ``started`` and ``now``, by table and entry."""
    changed = [f"[plugins] {key}" for key in _changed_keys(started.plugins.model_dump(), now.plugins.model_dump())]
    changed += [f"[backends.{name}]" for name in _changed_keys(started.backends, now.backends)]
    for position in range(max(len(started.engines), len(now.engines))):
        old = started.engines[position] if position < len(started.engines) else None
        new = now.engines[position] if position < len(now.engines) else None
        if old != new:
            state = "added" if old is None else "removed" if new is None else "changed"
            section = new or old
            assert section is not None  # one of them is, as they differ
            changed.append(f"[[engines]] {position} ({section.served_model_name or section.backend}, {state})")
    return changed


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def route_changes(before: RouteSections, after: RouteSections) -> list[str]:
    """What changed between two route tables, one line per split or mirror added, removed or changed."""
    return [
        *_keyed_changes(
            "split", {repr(s.name): s for s in before.splits}, {repr(s.name): s for s in after.splits}, _split_diff
        ),
        *_keyed_changes(
            "mirror",
            {f"{m.name!r} -> {m.shadow!r}": m for m in before.mirrors},
            {f"{m.name!r} -> {m.shadow!r}": m for m in after.mirrors},
            _mirror_diff,
        ),
    ]


def _keyed_changes(
    kind: str,
    before: Mapping[str, _Section],
    after: Mapping[str, _Section],
    diff: Callable[[_Section | None, _Section], str],
) -> list[str]:
    lines = []
    for key in [*before, *(key for key in after if key not in before)]:
        if key not in after:
            lines.append(f"{kind} {key} removed")
        elif key not in before:
            lines.append(f"{kind} {key} added: {diff(None, after[key])}")
        elif before[key] != after[key]:
            lines.append(f"{kind} {key}: {diff(before[key], after[key])}")
    return lines


def _split_diff(before: SplitSection | None, after: SplitSection) -> str:
    if before is None:
        weights = ", ".join(f"{engine} {weight}" for engine, weight in after.engines.items())
        aliases = f"; aliases {', '.join(after.aliases)}" if after.aliases else ""
        return f"weights {weights}; sticky {', '.join(after.sticky) or 'none'}{aliases}"
    parts = []
    for engine in [*after.engines, *(engine for engine in before.engines if engine not in after.engines)]:
        old, new = before.engines.get(engine), after.engines.get(engine)
        if old is None:
            parts.append(f"{engine} added with weight {new}")
        elif new is None:
            parts.append(f"{engine} removed (weight {old})")
        elif old != new:
            parts.append(f"weight of {engine} {old} -> {new}")
    for field in ("sticky", "aliases"):
        old_list, new_list = getattr(before, field), getattr(after, field)
        if old_list != new_list:
            parts.append(f"{field} {', '.join(old_list) or 'none'} -> {', '.join(new_list) or 'none'}")
    if before.analysis != after.analysis:
        parts.append(_analysis_diff(before.analysis, after.analysis))
    return ", ".join(parts)


def _analysis_diff(before: AnalysisSection | None, after: AnalysisSection | None) -> str:
    if before is None or after is None:
        return "analysis added (a canary starts)" if before is None else "analysis removed (its canary stops)"
    if before.model_copy(update={"paused": after.paused}) == after:
        return "analysis paused" if after.paused else "analysis resumed"
    return "analysis changed (its canary starts again)"


def _mirror_diff(before: MirrorSection | None, after: MirrorSection) -> str:
    if before is None:
        return f"{after.percent:g}% of requests, at most {after.max_in_flight} in flight"
    parts = []
    if before.percent != after.percent:
        parts.append(f"percent {before.percent:g} -> {after.percent:g}")
    if before.max_in_flight != after.max_in_flight:
        parts.append(f"max_in_flight {before.max_in_flight} -> {after.max_in_flight}")
    return ", ".join(parts)


__all__ = [
    "HangupReload",
    "Reloaded",
    "RouteReloader",
    "RouteSections",
    "Routed",
    "SignalCaller",
    "restart_changes",
    "route_changes",
]
