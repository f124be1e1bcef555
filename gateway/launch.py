"""From configuration to running engines: load each driver, validate its options, start it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .config import Config, ConfigError, EngineSection, engine_settings
from .engines import ConfigurationError, Engine, EngineSet
from .plugins import load_backend
from .spi.backend import Backend

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """A configured engine failed to start (its own error, logged by it, is the cause)."""


@dataclass(frozen=True)
class _Planned:
    section: EngineSection
    backend: Backend
    served_name: str


def plan_engines(sections: Sequence[EngineSection], config: Config) -> list[_Planned]:
    """Load drivers and validate options and names before anything starts."""
    if not sections:
        raise ConfigurationError("no engine to serve: pass --backend, or add [[engines]] to plugins.toml")
    planned: list[_Planned] = []
    names: set[str] = set()
    for position, section in enumerate(sections):
        driver = load_backend(section.backend, config.plugins.allow)
        options = {**config.backends.get(section.backend, {}), **section.options}
        settings = engine_settings(driver.Settings, options, f"engines[{position}] ({section.backend}) options")
        served = section.served_model_name or settings.model or section.backend
        for name in (served, *section.aliases):
            if name in names:
                raise ConfigurationError(f"model name {name!r} is served twice")
            names.add(name)
        planned.append(_Planned(section, driver(settings), served))
    return planned


async def start_engines(sections: Sequence[EngineSection], config: Config) -> EngineSet:
    """Start every configured engine; on any failure stop the ones already started."""
    started: list[Engine] = []
    running: list[_Planned] = []  # started backends, including one whose facts are then refused
    try:
        for plan in plan_engines(sections, config):
            log.info("starting %s engine for model %r", plan.section.backend, plan.served_name)
            try:
                facts = await plan.backend.start()
            except (ConfigError, ConfigurationError, OSError):
                raise  # the user's to fix, reported as a usage error
            except Exception as exc:
                name = f"{plan.served_name!r} ({plan.section.backend})"
                raise EngineStartError(f"engine {name} failed to start: {type(exc).__name__}: {exc}") from exc
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


__all__ = ["EngineStartError", "plan_engines", "start_engines"]
