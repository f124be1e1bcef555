"""``plugins``: finding and loading exactly one backend driver from its entry point.

The plugins here are real installed distributions: a temporary ``*.dist-info`` directory on
``sys.path`` with an ``entry_points.txt``, as pip would leave them, so both the metadata
listing and stevedore's loader see them exactly as they see a third-party package.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import stevedore._cache
from openengine_gateway.errors import PluginError
from openengine_gateway.plugins import GROUP, installed_backends, load_backend, missing_packages
from openengine_gateway.spi import SPI_VERSION, Backend
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
}

DISTRIBUTIONS = {
    "oe_plugins_main-1.2": f"""
        [{GROUP}]
        good = {PACKAGE}.good:GoodBackend
        broken = {PACKAGE}.broken:Backend
        old = {PACKAGE}.old:OldBackend
        notabackend = {PACKAGE}.good:NotABackend
        dup = {PACKAGE}.good:GoodBackend

        [some.other.group]
        good = {PACKAGE}.broken:Backend
    """,
    "oe_plugins_extra-0.3": f"""
        [{GROUP}]
        dup = {PACKAGE}.good:OtherBackend
    """,
}

REQUIRES = {
    # The extra of the backend's name holds what its engine needs (the distribution's module is there).
    "oe_plugins_main": ['turbo-engine>=2; extra == "good"', f'{PACKAGE}; extra == "good"', 'pytest; extra == "dev"'],
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


def test_wrong_spi_version_is_refused(plugins: Path) -> None:
    with pytest.raises(
        PluginError,
        match=re.escape(
            "'old' from oe_plugins_main 1.2 implements backend SPI version 0; "
            f"this gateway implements version {SPI_VERSION}"
        ),
    ):
        load_backend("old")


def test_a_class_that_is_not_a_backend_is_refused(plugins: Path) -> None:
    with pytest.raises(PluginError, match=re.escape("is not a openengine_gateway.spi.Backend subclass")):
        load_backend("notabackend")


def test_a_name_registered_twice_is_ambiguous(plugins: Path) -> None:
    with pytest.raises(PluginError, match="'dup' is registered by several distributions: ") as raised:
        load_backend("dup")
    assert "oe_plugins_main 1.2" in raised.value.args[0] and "oe_plugins_extra 0.3" in raised.value.args[0]
