"""``plugins``: finding and loading exactly one backend driver from its entry point.

The plugins here are real installed distributions: a temporary ``*.dist-info`` directory on
``sys.path`` with an ``entry_points.txt``, as pip would leave them, so both the metadata
listing and stevedore's loader see them exactly as they see a third-party package.
"""

from __future__ import annotations

import logging
import pkgutil
import re
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import stevedore._cache
from openengine_backends.mock import MockBackend
from openengine_gateway import compat, pb
from openengine_gateway.conformance import Outcome, all_rules, in_process_target, run_rule
from openengine_gateway.errors import PluginError
from openengine_gateway.plugins import GROUP, installed_backends, load_backend, missing_packages
from openengine_gateway.spi import (
    SPI_VERSION,
    Backend,
    EventStream,
    GenerationEvent,
    GenerationRequest,
    HealthCheck,
    KvEventSource,
    Load,
)
from stevedore import ExtensionManager

PACKAGE = "oe_test_plugins"

MODULES = {
    "__init__.py": "",
    "good.py": """
        from openengine_gateway.spi import Backend

        class GoodBackend(Backend):
            name = "good"

        class OtherBackend(Backend):
            name = "dup"

        class NotABackend:
            pass
    """,
    "broken.py": """
        raise ImportError("this driver needs the engine package 'turbo-engine'")
    """,
    "old.py": """
        from openengine_gateway.spi import Backend

        class OldBackend(Backend):
            spi_version = 0
    """,
    "newer.py": """
        from openengine_gateway.spi import Backend

        class NewerBackend(Backend):
            spi_version = 3
    """,
    "coroutine.py": """
        from openengine_gateway.spi import Backend

        class CoroutineBackend(Backend):
            spi_version = 2

            async def generate(self, request):
                return None
    """,
    # As the guide of gateway 0.1 (SPI revision 1) taught: no spi_version, wire messages, an async generator.
    "v1.py": """
        from openengine_gateway import pb
        from openengine_gateway.spi import SPI_VERSION, Backend, EngineFacts, OutputFinished, UsageReport

        class V1Backend(Backend):
            name = "v1"

            async def start(self):
                return EngineFacts("v1", "1", pb.ModelInfo())

            async def stop(self):
                pass

            def generate(self, request):
                return self._events()

            async def _events(self):
                yield UsageReport(1, 0)
                yield OutputFinished(0, pb.FINISH_REASON_LENGTH)

            async def abort(self, request_id):
                pass

            async def load(self):
                return pb.LoadInfo(running_requests=3)

            async def check_health(self):
                return [pb.HealthCheck(name="model", state=pb.HEALTH_STATE_READY, message="up")]

            def kv_event_sources(self):
                return [pb.KvEventSource(topic="kv", data_parallel_rank=0)]

        class Inherited(V1Backend):
            spi_version = SPI_VERSION  # the installed gateway's: inherited by accident
    """,
}

DISTRIBUTIONS = {
    "oe_plugins_main-1.2": f"""
        [{GROUP}]
        good = {PACKAGE}.good:GoodBackend
        broken = {PACKAGE}.broken:Backend
        old = {PACKAGE}.old:OldBackend
        notabackend = {PACKAGE}.good:NotABackend
        dup = {PACKAGE}.good:GoodBackend
        renamed = {PACKAGE}.good:GoodBackend

        [some.other.group]
        good = {PACKAGE}.broken:Backend
    """,
    "oe_plugins_extra-0.3": f"""
        [{GROUP}]
        dup = {PACKAGE}.good:OtherBackend
        newer = {PACKAGE}.newer:NewerBackend
        coroutine = {PACKAGE}.coroutine:CoroutineBackend
    """,
    "oe_plugins_v1-0.1.5": f"""
        [{GROUP}]
        v1 = {PACKAGE}.v1:V1Backend
        inherited = {PACKAGE}.v1:Inherited
    """,
    "oe_plugins_far-9.0": f"""
        [{GROUP}]
        far = {PACKAGE}.good:GoodBackend
    """,
}

REQUIRES = {
    # The extra of the backend's name holds what its engine needs (the distribution's module is there).
    "oe_plugins_main": ['turbo-engine>=2; extra == "good"', f'{PACKAGE}; extra == "good"', 'pytest; extra == "dev"'],
    "oe_plugins_v1": ["openengine-gateway>=0.1,<0.2"],  # the pin of a plugin written for SPI revision 1
    "oe_plugins_far": ["openengine-gateway>=9"],
}


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install the fake distributions on ``sys.path`` for one test, with fresh loader caches."""
    package = tmp_path / PACKAGE
    package.mkdir()
    for name, source in MODULES.items():
        (package / name).write_text(textwrap.dedent(source))
    for dist, entry_points in DISTRIBUTIONS.items():
        name, version = dist.rsplit("-", 1)
        info = tmp_path / f"{dist}.dist-info"
        info.mkdir()
        requires = "".join(f"Requires-Dist: {line}\n" for line in REQUIRES.get(name, ()))
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    monkeypatch.syspath_prepend(str(tmp_path))
    # stevedore caches entry points per process and on disk: give this test its own caches.
    monkeypatch.setattr(ExtensionManager, "ENTRY_POINT_CACHE", {})
    monkeypatch.setattr(
        stevedore._cache, "get_group_all", stevedore._cache.Cache(str(tmp_path / "cache")).get_group_all
    )
    yield tmp_path
    for module in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[module]


def test_installed_backends_are_listed_without_importing(plugins: Path) -> None:
    listed = {(b.name, b.distribution): b for b in installed_backends()}
    good = listed[("good", "oe_plugins_main")]
    assert (good.target, good.version) == (f"{PACKAGE}.good:GoodBackend", "1.2")
    assert ("dup", "oe_plugins_extra") in listed
    assert not any(name == "good" and b.target.endswith("broken:Backend") for (name, _), b in listed.items())
    assert PACKAGE not in sys.modules
    names = [b.name for b in installed_backends()]
    assert names == sorted(names)


def test_load_imports_only_the_selected_driver(plugins: Path) -> None:
    driver = load_backend("good")
    assert issubclass(driver, Backend) and driver.__name__ == "GoodBackend"
    assert f"{PACKAGE}.good" in sys.modules
    assert f"{PACKAGE}.broken" not in sys.modules
    assert f"{PACKAGE}.old" not in sys.modules


def test_a_class_named_otherwise_is_served_by_its_entry_point_s_name_with_a_warning(
    plugins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="openengine_gateway.plugins"):
        assert load_backend("renamed").__name__ == "GoodBackend"
    (line,) = [record.getMessage() for record in caplog.records]
    assert line == (
        "backend 'renamed' (oe_plugins_main): its class GoodBackend names itself 'good'; it is served as "
        "'renamed', its entry point's name (set Backend.name = 'renamed')"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="openengine_gateway.plugins"):
        load_backend("good")
    assert caplog.records == []


def test_unknown_backend_lists_installed_ones(plugins: Path) -> None:
    with pytest.raises(PluginError, match="unknown backend 'nope'; installed backends: ") as raised:
        load_backend("nope")
    for name in ("broken", "dup", "good", "notabackend", "old"):
        assert name in raised.value.args[0]


def test_an_unknown_backend_is_unknown_before_it_is_not_allowed_with_the_closest_name(plugins: Path) -> None:
    with pytest.raises(PluginError, match=r"unknown backend 'godo' \(did you mean 'good'\?\); installed backends: "):
        load_backend("godo", allowed=["good"])


def test_what_a_backend_s_engine_lacks_here_is_found_without_importing(plugins: Path) -> None:
    backends = {b.name: b for b in installed_backends()}
    assert missing_packages(backends["good"]) == ("turbo-engine",)  # its own module is importable, not imported
    assert f"{PACKAGE}.good" not in sys.modules
    assert backends["good"].install_hint == "pip install 'oe_plugins_main[good]'"
    assert missing_packages(backends["old"]) == ()  # no extra of its name: nothing known to lack


def test_allowlist(plugins: Path) -> None:
    with pytest.raises(PluginError, match=r"'good' is not allowed by the configuration; allowed: \['old'\]"):
        load_backend("good", allowed=["old"])
    assert f"{PACKAGE}.good" not in sys.modules  # refused before anything is imported
    with pytest.raises(PluginError, match="not allowed"):
        load_backend("good", allowed=[])
    assert load_backend("good", allowed=["good", "old"]).__name__ == "GoodBackend"


def test_import_failure_names_the_distribution_with_the_traceback(plugins: Path) -> None:
    with pytest.raises(PluginError) as raised:
        load_backend("broken")
    message = raised.value.args[0]
    assert (
        f"backend 'broken' ({PACKAGE}.broken:Backend) from distribution oe_plugins_main 1.2 failed to import" in message
    )
    assert "Traceback (most recent call last)" in message
    assert "broken.py" in message
    assert "ImportError: this driver needs the engine package 'turbo-engine'" in message


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "old",
            "backend 'old' from distribution oe_plugins_main 1.2 targets backend SPI revision 0 (declared "
            f"spi_version = 0); this gateway implements revision {SPI_VERSION} and serves revision {SPI_VERSION} "
            "natively and 1 through its compatibility layer: revision 0 is no longer served",
        ),
        ("newer", "targets backend SPI revision 3 (declared spi_version = 3); this gateway implements revision 2"),
        ("coroutine", "its generate is a coroutine function (async def without yield); generate must be synchronous"),
        ("far", "targets backend SPI revision ? (from its requirement openengine-gateway>=9); this gateway implements"),
    ],
)
def test_a_revision_that_cannot_be_served_is_refused_at_load_time(plugins: Path, name: str, message: str) -> None:
    with pytest.raises(PluginError, match=re.escape(message)) as raised:
        load_backend(name)
    assert raised.value.exit_code == 2


async def test_a_revision_1_plugin_is_served_through_the_compatibility_layer(
    plugins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="openengine_gateway.plugins"):
        driver = load_backend("v1")
    lines = [record.getMessage() for record in caplog.records]
    prefix = "backend 'v1' (oe_plugins_v1 0.1.5) targets SPI revision 1: its "
    assert [line.removeprefix(prefix).split(";")[0] for line in lines] == [
        "generate returns an async iterator of events",
        "load returns a pb.LoadInfo message",
        "check_health returns pb.HealthCheck messages",
        "kv_event_sources returns pb.KvEventSource messages",
    ]
    assert "revision 2 returns an spi.Load value" in lines[1] and all(line.startswith(prefix) for line in lines)
    assert driver.__name__ == "V1Backend" and driver.name == "v1" and driver.spi_version == SPI_VERSION
    backend = driver(driver.Settings())
    stream = backend.generate(GenerationRequest("r", "m", prompt="x"))
    assert isinstance(stream, EventStream)
    assert [type(event).__name__ async for event in stream] == ["UsageReport", "OutputFinished"]
    assert await backend.load() == Load(running_requests=3, ranks=[])
    assert await backend.check_health() == [HealthCheck("model", pb.HEALTH_STATE_READY, "up")]
    assert backend.kv_event_sources() == [KvEventSource(topic="kv", data_parallel_rank=0)]


async def test_the_revision_comes_from_the_plugin(plugins: Path) -> None:
    drivers = {
        "v1": f"{PACKAGE}.v1:V1Backend",
        "inherited": f"{PACKAGE}.v1:Inherited",
        "good": f"{PACKAGE}.good:GoodBackend",
        "mock": "openengine_backends.mock:MockBackend",
    }
    dists = {
        "v1": "oe_plugins_v1",
        "inherited": "oe_plugins_v1",
        "good": "oe_plugins_main",
        "mock": "openengine-gateway",
    }
    verdicts = {
        name: compat.assess(pkgutil.resolve_name(target), name, dists[name]) for name, target in drivers.items()
    }
    assert verdicts["v1"].summary == "SPI 1 (from its requirement openengine-gateway<0.2,>=0.1) compat"
    assert verdicts["inherited"].summary == (
        f"SPI 1 (declared spi_version = {SPI_VERSION}, but its requirement openengine-gateway<0.2,>=0.1 admits 1) "
        "compat"
    )
    inherited = load_backend("inherited")
    assert isinstance(inherited(inherited.Settings()).generate(GenerationRequest("r", "m", prompt="x")), EventStream)
    assert verdicts["good"].summary == "SPI 1 (none declared: assumed the oldest served) compat"
    assert verdicts["mock"].summary == f"SPI {SPI_VERSION} (in tree) native"


def test_a_declared_revision_is_an_int_checked_where_the_class_is_written() -> None:
    with pytest.raises(TypeError, match=r"\.Declared\.spi_version must be an SPI revision, an int .*got '2'"):

        class Declared(Backend):  # type: ignore[type-arg]
            spi_version = "2"  # type: ignore[assignment]


class FutureBackend(MockBackend):
    spi_version = SPI_VERSION + 1


class Revision1Mock(MockBackend):
    """The mock in revision 1's shapes: an async generator from ``generate``, a wire message from ``load``."""

    spi_version = 1

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        return aiter(super().generate(request))

    async def load(self) -> pb.LoadInfo:  # type: ignore[override]
        return pb.LoadInfo(running_requests=0, queued_requests=0)


async def test_the_in_process_harness_checks_the_revision_as_the_command_does() -> None:
    with pytest.raises(PluginError, match=f"targets backend SPI revision {SPI_VERSION + 1}"):
        async with in_process_target(FutureBackend(MockBackend.Settings())):
            pass
    backend = Revision1Mock(MockBackend.Settings())
    async with in_process_target(backend) as target:  # served through the compatibility layer, as by the command
        assert type(backend) is not Revision1Mock and isinstance(backend, Revision1Mock)  # its adapter
        rules = [rule for rule in all_rules() if rule.id in ("generate.usage-cumulative", "load.idle-is-zero")]
        assert [(await run_rule(rule, target)).outcome for rule in rules] == [Outcome.PASSED, Outcome.PASSED]


def test_a_class_that_is_not_a_backend_is_refused(plugins: Path) -> None:
    with pytest.raises(PluginError, match=re.escape("is not a openengine_gateway.spi.Backend subclass")):
        load_backend("notabackend")


def test_a_name_registered_twice_is_ambiguous(plugins: Path) -> None:
    with pytest.raises(PluginError, match="'dup' is registered by several distributions: ") as raised:
        load_backend("dup")
    assert "oe_plugins_main 1.2" in raised.value.args[0] and "oe_plugins_extra 0.3" in raised.value.args[0]
