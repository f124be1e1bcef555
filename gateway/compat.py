"""Drivers written for an earlier backend SPI revision: which revision a driver targets, and how it is served.

A plugin is published once and installed for months, while the gateway beneath it is upgraded. So the
revision a driver targets comes from the plugin itself, never from the installed gateway: its
``spi_version`` declaration, else its distribution's requirement on ``openengine-gateway`` (the releases
it admits, ``RELEASES``), else the oldest revision still served. A driver of the current revision is
served as it is; one of an older revision still served is served through an adapter subclass
(``adapt``) that turns its old shapes into today's, with one deprecation line per adaptation; anything
else is refused when it is loaded, naming the plugin, its distribution and both revisions.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from typing import Any, TypeVar

from packaging.requirements import InvalidRequirement, Requirement

from . import __version__, pb
from .spi import wire
from .spi.backend import SPI_VERSION, Backend
from .spi.events import EventStream
from .spi.kv_events import KvEventBatch, KvEventSource
from .spi.requests import ClassifyCall, EmbedCall, GenerationRequest, ScoreCall
from .spi.results import Classification, Embedding, HealthCheck, Load, ScoreResult, TaskUsage

GATEWAY = "openengine-gateway"
"""The distribution a plugin requires; the in-tree drivers are part of it."""
RELEASES: dict[int, tuple[str, ...]] = {1: ("0.1.0",), 2: ("0.2.0",)}
"""The gateway releases that implement each SPI revision (docs/writing-a-backend.md lists them)."""
OLDEST_SERVED = 1
"""The oldest revision still served (through the compatibility layer); assumed when a driver declares none."""

# What revision 1 returned, what revision 2 returns instead: one deprecation line per overridden method.
_REVISION_1_SHAPES = {
    "generate": ("returns an async iterator of events", "an spi.EventStream (EventStream.from_iterator(...))"),
    "embed": ("returns pb.EmbeddingOutput and pb.TaskUsage messages", "spi.Embedding and spi.TaskUsage values"),
    "classify": (
        "returns pb.ClassificationOutput and pb.TaskUsage messages",
        "spi.Classification and spi.TaskUsage values",
    ),
    "score": ("returns pb.ScoreResponse and pb.TaskUsage messages", "spi.ScoreResult and spi.TaskUsage values"),
    "load": ("returns a pb.LoadInfo message", "an spi.Load value"),
    "check_health": ("returns pb.HealthCheck messages", "spi.HealthCheck values"),
    "kv_event_sources": ("returns pb.KvEventSource messages", "spi.KvEventSource values"),
    "kv_events": ("yields pb.KvEventBatch messages", "spi.KvEventBatch values"),
}


class Service(Enum):
    """How the gateway serves a driver."""

    NATIVE = "native"
    COMPAT = "compat"
    REFUSED = "refused"


@dataclass(frozen=True)
class Verdict:
    """The revision a driver targets, where that came from, and how it is served."""

    revision: int | None
    """None when it cannot be known (a driver that fails to import)."""
    source: str
    """How the revision was found: ``declared``, ``in tree``, the requirement, or ``none declared``."""
    service: Service
    deprecations: tuple[str, ...] = ()
    """One per adaptation the compatibility layer makes (COMPAT): what the driver uses, what replaces it."""
    reason: str = ""
    """Why it is refused (REFUSED)."""
    plugin: str = ""
    distribution: str = ""

    @property
    def shown(self) -> str:
        """The revision as the messages show it: ``?`` when unknown."""
        return "?" if self.revision is None else str(self.revision)

    @property
    def summary(self) -> str:
        """``SPI 1 (none declared...) compat``: the ``backends`` column (a refusal with its reason)."""
        reason = f": {self.reason}" if self.service is Service.REFUSED else ""
        return f"SPI {self.shown} ({self.source}) {self.service.value}{reason}"

    def warnings(self) -> list[str]:
        """The load-time deprecation lines, one per adaptation, each naming the plugin."""
        return [
            f"backend {self.plugin!r} ({self.distribution}) targets SPI revision {self.revision}: {deprecation}. "
            f"Served through the compatibility layer; declare spi_version = {SPI_VERSION} once migrated "
            "(CHANGELOG.md)"
            for deprecation in self.deprecations
        ]

    def refusal(self) -> str:
        """The load-time error: the plugin, its distribution, both revisions and why."""
        return (
            f"backend {self.plugin!r} from distribution {self.distribution} targets backend SPI revision "
            f"{self.shown} ({self.source}); this gateway implements revision {SPI_VERSION} and serves "
            f"{_served()}: {self.reason}"
        )


def in_tree(plugin: str) -> Verdict:
    """The verdict on a driver of the gateway's own distribution, which moves with it (nothing imported)."""
    return Verdict(SPI_VERSION, "in tree", Service.NATIVE, plugin=plugin, distribution=f"{GATEWAY} {__version__}")


def unloadable(plugin: str, where: str, reason: str) -> Verdict:
    """The verdict on a driver that cannot even be read (fails to import, is not a ``Backend``)."""
    return Verdict(None, "unknown", Service.REFUSED, reason=reason, plugin=plugin, distribution=where)


def _served() -> str:
    older = ", ".join(str(r) for r in range(OLDEST_SERVED, SPI_VERSION))
    return f"revision {SPI_VERSION} natively" + (f" and {older} through its compatibility layer" if older else "")


def declared_revision(driver: type[Backend[Any]]) -> int | None:
    """The ``spi_version`` the driver (or a driver class it extends) declares; inheriting ``Backend``'s is not one."""
    for cls in driver.__mro__:
        if cls is Backend:
            return None
        value = cls.__dict__.get("spi_version")
        if value is not None:
            return int(value)
    return None


def distribution_of(driver: type[Backend[Any]]) -> tuple[str, str]:
    """The distribution (name, version) whose package defines ``driver``; ``("", "")`` for none (a test's)."""
    package = driver.__module__.partition(".")[0]
    if package in ("openengine_gateway", "openengine_backends"):
        return GATEWAY, __version__
    names = packages_distributions().get(package)
    return (names[0], distribution(names[0]).version) if names else ("", "")


def required_revisions(dist: str) -> tuple[str, list[int]] | None:
    """The distribution's requirement on the gateway and the revisions whose releases it admits, or None."""
    try:
        requires = (distribution(dist).requires or []) if dist else []
    except PackageNotFoundError:
        return None
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name != GATEWAY or requirement.marker is not None:
            continue
        admitted = [
            r for r, versions in sorted(RELEASES.items()) if any(requirement.specifier.contains(v) for v in versions)
        ]
        return f"{GATEWAY}{requirement.specifier}", admitted
    return None


def assess(driver: type[Backend[Any]], plugin: str, dist: str, version: str = "") -> Verdict:
    """Which revision ``driver`` (registered as ``plugin`` by ``dist``) targets and how it is served."""
    where = f"{dist} {version}".strip()
    declared = declared_revision(driver)
    requirement = required_revisions(dist) if dist != GATEWAY else None
    pin, admitted = requirement if requirement is not None else ("", [])
    if declared is not None and admitted and declared not in admitted and declared <= SPI_VERSION:
        # ``spi_version = SPI_VERSION`` imported from the gateway inherits by accident: the older of the two is
        # served, through the layer that takes either revision's shapes.
        revision = min(declared, admitted[0])
        source = f"declared spi_version = {declared}, but its requirement {pin} admits {admitted[0]}"
    elif declared is not None:
        revision, source = declared, f"declared spi_version = {declared}"
    elif dist == GATEWAY:
        revision, source = SPI_VERSION, "in tree"
    elif admitted:
        revision, source = admitted[0], f"from its requirement {pin}"
    elif pin:
        known = ", ".join(f"{r}: {', '.join(v)}" for r, v in sorted(RELEASES.items()))
        return Verdict(
            None,
            f"from its requirement {pin}",
            Service.REFUSED,
            reason=f"the requirement admits no release this gateway knows (releases per revision: {known})",
            plugin=plugin,
            distribution=where,
        )
    else:
        revision, source = OLDEST_SERVED, "none declared: assumed the oldest served"
    reason = _refusal(driver, revision)
    if reason:
        return Verdict(revision, source, Service.REFUSED, reason=reason, plugin=plugin, distribution=where)
    if revision == SPI_VERSION:
        return Verdict(revision, source, Service.NATIVE, plugin=plugin, distribution=where)
    lines = tuple(
        f"its {method} {old}; revision {SPI_VERSION} returns {new}"
        for method, (old, new) in _REVISION_1_SHAPES.items()
        if _overrides(driver, method)
    )
    return Verdict(revision, source, Service.COMPAT, lines, plugin=plugin, distribution=where)


def _refusal(driver: type[Backend[Any]], revision: int) -> str:
    """Why a driver of ``revision`` cannot be served honestly, or ``""``."""
    if revision > SPI_VERSION:
        return "it was written for a newer gateway; upgrade openengine-gateway"
    if revision < OLDEST_SERVED:
        return f"revision {revision} is no longer served; install a release of the plugin written for {SPI_VERSION}"
    if inspect.iscoroutinefunction(driver.generate):
        # A coroutine's verdict arrives after acceptance, so a bad request could not be refused with its status.
        return "its generate is a coroutine function (async def without yield); generate must be synchronous"
    return ""


def _overrides(driver: type[Backend[Any]], method: str) -> bool:
    """Whether the driver has its own ``method`` in revision 1's shape: one whose return annotation names
    today's shape (an ``EventStream``, already allowed in revision 1; an SPI value, not a ``pb.`` message)
    is not adapted, so it gets no deprecation."""
    own = getattr(driver, method)
    if own is getattr(Backend, method):
        return False
    annotation = inspect.signature(own, eval_str=False).return_annotation
    if annotation is inspect.Signature.empty:
        return True
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return "EventStream" not in text if method == "generate" else "pb." in text


def serve(driver: type[Backend[Any]], verdict: Verdict) -> type[Backend[Any]]:
    """The class the gateway instantiates for ``driver``: itself, or its adapter (COMPAT)."""
    return adapt(driver) if verdict.service is Service.COMPAT else driver


def adapt(driver: type[Backend[Any]]) -> type[Backend[Any]]:
    """A subclass of a revision-1 driver that speaks revision 2: same name, settings and behaviour.

    It has no state of its own (``__slots__ = ()``), so an instance already made can take it as its
    class (``in_process_target`` does).
    """
    namespace = {
        "__slots__": (),
        "__module__": driver.__module__,
        "__qualname__": driver.__qualname__,
        "__doc__": driver.__doc__,
        "spi_version": SPI_VERSION,
    }
    return type(driver.__name__, (_Revision1, driver), namespace)


T = TypeVar("T")


def _values(items: Sequence[Any], message: type[Any], convert: Callable[[Sequence[Any]], list[T]]) -> Sequence[Any]:
    """``items`` as SPI values: converted when the driver returned wire messages, as they are otherwise."""
    return convert(items) if any(isinstance(item, message) for item in items) else items


def _usage(usage: Any) -> TaskUsage:
    return wire.usage(usage) if isinstance(usage, pb.TaskUsage) else usage


async def _kv_values(batches: AsyncIterator[Any]) -> AsyncIterator[KvEventBatch]:
    async for batch in batches:
        yield wire.kv_batch(batch) if isinstance(batch, pb.KvEventBatch) else batch


class _Revision1(Backend[Any]):
    """Revision 1's shapes turned into revision 2's; each method accepts either, so a driver that
    returns today's values from one method and yesterday's from another is served alike."""

    __slots__ = ()

    def generate(self, request: GenerationRequest) -> EventStream:
        events = super().generate(request)  # type: ignore[safe-super]
        return events if isinstance(events, EventStream) else EventStream.from_iterator(events)

    async def embed(self, call: EmbedCall) -> tuple[Sequence[Embedding], TaskUsage]:
        outputs, usage = await super().embed(call)
        return _values(outputs, pb.EmbeddingOutput, wire.embeddings), _usage(usage)

    async def classify(self, call: ClassifyCall) -> tuple[Sequence[Classification], TaskUsage]:
        outputs, usage = await super().classify(call)
        return _values(outputs, pb.ClassificationOutput, wire.classifications), _usage(usage)

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        result, usage = await super().score(call)
        converted = wire.score_result(result) if isinstance(result, pb.ScoreResponse) else result
        return converted, _usage(usage)

    async def load(self) -> Load:
        snapshot = await super().load()
        return wire.load(snapshot) if isinstance(snapshot, pb.LoadInfo) else snapshot

    async def check_health(self) -> list[HealthCheck]:
        return list(_values(await super().check_health(), pb.HealthCheck, wire.health_checks))

    def kv_event_sources(self) -> list[KvEventSource]:
        sources = super().kv_event_sources()
        return [wire.kv_source(s) if isinstance(s, pb.KvEventSource) else s for s in sources]

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        return _kv_values(super().kv_events())


__all__ = [
    "OLDEST_SERVED",
    "RELEASES",
    "Service",
    "Verdict",
    "adapt",
    "assess",
    "declared_revision",
    "distribution_of",
    "in_tree",
    "required_revisions",
    "serve",
    "unloadable",
]
