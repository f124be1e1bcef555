"""From configuration to running engines: load each driver, validate its options, start it."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config, EngineSection, anchor_typed_paths, did_you_mean, engine_settings, looks_like_path
from .engines import Engine, EngineSet, check_exclusive
from .errors import ConfigurationError, EngineStartError, PluginError
from .plugins import installed_backends, load_backend
from .routes import plan_routes
from .spi.backend import Backend, BackendSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Planned:
    section: EngineSection
    backend: Backend[Any]
    served_name: str
    label: str


def plan_engines(
    sections: Sequence[EngineSection],
    config: Config,
    *,
    command_line: bool = False,
    gateway_flags: Collection[str] = (),
) -> list[_Planned]:
    """Load drivers and validate options and names (the engines', and those ``[[splits]]`` and
    ``[[mirrors]]`` use) before anything starts; errors name the engine (``engines[i]`` of the file,
    or ``--backend NAME`` for the command line's one) and, for an unknown option, the closest known
    one (the command line's among ``gateway_flags`` too)."""
    if not sections:
        raise ConfigurationError("no engine to serve: pass --backend, or add [[engines]] to plugins.toml")
    _check_backend_tables(config)
    planned: list[_Planned] = []
    names: dict[str, str] = {}  # name -> the engine serving it
    drivers: dict[str, type[Backend[Any]]] = {}  # each backend loaded once: its deprecations are logged once
    for position, section in enumerate(sections):
        label = f"--backend {section.backend}" if command_line else f"engines[{position}] ({section.backend})"
        if section.backend not in drivers:
            try:
                drivers[section.backend] = load_backend(section.backend, config.plugins.allow)
            except PluginError as exc:
                raise PluginError(f"{label}: {exc}") from None
        driver = drivers[section.backend]
        # The file's relative paths are the file's: a path-typed option too (command-line values stay as given).
        defaults = anchor_typed_paths(driver.Settings, config.backends.get(section.backend, {}), config.directory)
        options = (
            section.options if command_line else anchor_typed_paths(driver.Settings, section.options, config.directory)
        )
        notes = _notes(driver.Settings, section, defaults, gateway_flags if command_line else None)
        settings = engine_settings(driver.Settings, {**defaults, **options}, f"{label} options", notes)
        _check_model_path(settings.model, label)
        served = section.served_model_name or settings.model or section.backend
        for kind, name in (("name", served), *(("alias", alias) for alias in section.aliases)):
            if name in names:
                raise ConfigurationError(f"{label}: model {kind} {name!r} is served twice (also by {names[name]})")
            names[name] = label
        planned.append(_Planned(section, driver(settings), served, label))
    check_exclusive([(plan.label, plan.backend) for plan in planned])
    engine_names = {name: plan.served_name for plan in planned for name in (plan.served_name, *plan.section.aliases)}
    plan_routes(engine_names, config.splits, config.mirrors)  # a typo in a split is reported before engines load
    return planned


def _notes(
    settings_model: type[BackendSettings],
    section: EngineSection,
    defaults: Mapping[str, Any],
    gateway_flags: Collection[str] | None,
) -> dict[str, str]:
    """Per option, what its error adds: where it was set (``[backends.NAME]`` rather than the
    engine's options) and, when the driver has no such option, the closest one it has, as a flag
    beside the gateway's own flags for the command line (``--prot``: ``did you mean '--port'?``)."""
    fields = settings_model.model_fields
    notes: dict[str, list[str]] = {}
    for key in defaults:
        if key not in section.options:
            notes.setdefault(key, []).append(f"set in [backends.{section.backend}]")
    for key in {**defaults, **section.options}:
        if key in fields:
            continue
        if gateway_flags is None:
            hint = did_you_mean(key, fields)
        else:
            hint = did_you_mean(_flag(key), [*gateway_flags, *map(_flag, fields)])
        if hint:
            notes.setdefault(key, []).append(hint)
    return {key: "; ".join(parts) for key, parts in notes.items()}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _check_model_path(model: str, label: str) -> None:
    """A model that is a path must exist: said now, not as the hub's complaint about the id it is not."""
    if looks_like_path(model) and not Path(model).expanduser().exists():
        where = "" if Path(model).expanduser().is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigurationError(f"{label}: model path {model!r} does not exist{where}")


def _check_backend_tables(config: Config) -> None:
    """A ``[backends.NAME]`` table must name a backend that could load: a typo would drop its defaults."""
    allowed = config.plugins.allow
    installed = {backend.name for backend in installed_backends()}
    for name in config.backends:
        if allowed is not None and name not in allowed:
            raise ConfigurationError(f"[backends.{name}]: {name!r} is not in [plugins] allow ({', '.join(allowed)})")
        if name not in installed:
            known = ", ".join(sorted(installed))
            raise ConfigurationError(f"[backends.{name}]: no installed backend is called {name!r} (installed: {known})")


def _start_error(plan: _Planned, exc: BaseException) -> EngineStartError:
    name = f"{plan.served_name!r} ({plan.section.backend})"
    return EngineStartError(f"engine {name} failed to start: {type(exc).__name__}: {exc}")


async def start_engines(
    sections: Sequence[EngineSection],
    config: Config,
    *,
    command_line: bool = False,
    gateway_flags: Collection[str] = (),
    attachments: Sequence[object] | None = None,
) -> EngineSet:
    """Start every configured engine (planned as ``plan_engines`` says); on any failure stop the
    ones already started. ``attachments`` (a frontend process of ``--frontends``): per engine, what
    its ``Backend.attach`` takes to join the engine the supervisor started instead of starting one."""
    started: list[Engine] = []
    running: list[_Planned] = []  # started backends, including one whose facts are then refused
    try:
        plans = plan_engines(sections, config, command_line=command_line, gateway_flags=gateway_flags)
        for position, plan in enumerate(plans):
            log.info("starting %s engine for model %r", plan.section.backend, plan.served_name)
            if attachments is not None:
                plan.backend.attach(attachments[position])
            try:
                facts = await plan.backend.start()
            except ConnectionError as exc:  # an engine that is not answering, not a typo
                raise _start_error(plan, exc) from exc
            except ConfigurationError as exc:  # the user's to fix, reported as a usage error naming the engine
                raise ConfigurationError(f"{plan.label}: {exc}") from None
            except OSError:
                raise  # the user's to fix, reported as a usage error
            except Exception as exc:
                raise _start_error(plan, exc) from exc
            running.append(plan)
            started.append(Engine(plan.served_name, tuple(plan.section.aliases), plan.backend, facts))
        return EngineSet(started)
    except BaseException:
        for plan in reversed(running):
            try:
                await plan.backend.stop()
            except Exception:  # broad on purpose: the original failure is what the user needs
                log.exception("stopping %s after a failed start also failed", plan.served_name)
        raise


__all__ = ["plan_engines", "start_engines"]
