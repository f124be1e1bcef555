"""The SPI revision, the package version, the frozen plugins and the changelog agree.

A change of ``SPI_VERSION`` fails here until it comes with what keeps the plugins of the old revision
honest: a frozen plugin of every earlier revision still served (``tests/compat/spiN-*``, pinned to that
revision's releases), the releases of the new revision in ``compat.RELEASES`` with the package version
among them, and a CHANGELOG entry for each release and revision.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from openengine_gateway import __version__, compat
from openengine_gateway.spi import SPI_VERSION
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()


def frozen(revision: int) -> list[Path]:
    return sorted(path for path in (ROOT / "tests" / "compat").glob(f"spi{revision}-*") if path.is_dir())


def test_every_revision_has_its_releases_and_the_package_version_follows_the_spi() -> None:
    assert sorted(compat.RELEASES) == list(range(1, SPI_VERSION + 1))
    assert 1 <= compat.OLDEST_SERVED <= SPI_VERSION
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    assert __version__ in compat.RELEASES[SPI_VERSION], "a new SPI revision is a new minor version below 1.0"


@pytest.mark.parametrize("revision", range(compat.OLDEST_SERVED, SPI_VERSION))
def test_every_older_revision_served_has_a_frozen_plugin_pinned_to_its_releases(revision: int) -> None:
    folders = frozen(revision)
    assert len(folders) == 1, f"one frozen plugin for SPI revision {revision}: tests/compat/spi{revision}-*"
    folder = folders[0]
    assert "Do not edit" in (folder / "README.md").read_text()
    assert (folder.parent / "expected" / f"{folder.name}.json").exists(), "the kit's results when it was written"
    dependencies = tomllib.loads((folder / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d).specifier for d in dependencies if Requirement(d).name == compat.GATEWAY]
    admitted = {r for r, versions in compat.RELEASES.items() if any(pin.contains(v) for v in versions)}
    assert admitted == {revision}


@pytest.mark.parametrize(("revision", "release"), [(r, v) for r, vs in compat.RELEASES.items() for v in vs])
def test_the_changelog_has_every_release_and_its_revision(revision: int, release: str) -> None:
    assert re.search(rf"^## {re.escape(release)}: SPI revision {revision}$", CHANGELOG, re.MULTILINE)
    assert re.search(rf"^\| {re.escape(release)} \| {revision} \|", CHANGELOG, re.MULTILINE)
    if revision > 1:
        section = CHANGELOG.split(f"## {release}: SPI revision {revision}", 1)[1].split("\n## ", 1)[0]
        assert "Migration" in section, f"the {release} entry gives no migration for revision {revision}"


def test_the_guide_lists_the_releases_of_every_revision() -> None:
    guide = (ROOT / "docs" / "writing-a-backend.md").read_text()
    for revision, releases in compat.RELEASES.items():
        assert re.search(rf"^\| {revision} \| {re.escape(', '.join(releases))} \|", guide, re.MULTILINE)


def test_the_changelog_has_an_entry_for_the_current_revision() -> None:
    assert re.search(rf"^## [0-9.]+: SPI revision {SPI_VERSION}$", CHANGELOG, re.MULTILINE)
