"""The compatibility suite: every frozen plugin of an earlier SPI revision, served by the real command.

Each ``tests/compat/spiN-*`` folder is a plugin as it was published against SPI revision N (its README
says from which commit), installed beside today's gateway by ``make test`` (``.frozen-installed``). The
whole conformance kit runs against it through ``openengine-gateway conformance``, and its results must be
those recorded when it was written (``expected/<folder>.json``: the kit of its commit against the gateway
of its commit; a rule added since must not fail) and those the kit gives today's example plugin (the same
engine, written for today's revision): a plugin that was conformant when it was written stays conformant.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from openengine_gateway.plugins import installed_backends

from tests.process import command, gateway_process

HERE = Path(__file__).parent
FROZEN = sorted(path for path in HERE.glob("spi*-*") if (path / "pyproject.toml").exists())
INSTALLED = {(b.name, b.distribution) for b in installed_backends()}


def entry_point(folder: Path) -> tuple[str, str]:
    """The frozen plugin's (backend name, distribution), from its pyproject."""
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    (name,) = project["entry-points"]["openengine.backends"]
    return name, project["name"]


async def kit(backend: str, cwd: Path) -> tuple[dict[str, str], str]:
    """Every rule's outcome against ``backend`` served by the command, and the gateway's log."""
    async with gateway_process("--backend", backend, "--token-delay-s", "0.001", cwd=cwd) as gateway:
        process = await asyncio.create_subprocess_exec(
            *command(), "conformance", "--target", gateway.address, "--json", "-", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(process.communicate(), 240)
        assert await gateway.stop() == 0
        log = gateway.log.read_text()
    report: dict[str, Any] = json.loads(out)
    return {rule["id"]: rule["outcome"] for rule in report["rules"]}, log


@pytest.mark.skipif(
    ("echo", "openengine-echo-backend") not in INSTALLED,
    reason="the example plugin is not installed (pip install ./examples/openengine-echo-backend)",
)
@pytest.mark.parametrize("folder", FROZEN, ids=lambda path: path.name)
async def test_a_frozen_plugin_passes_the_whole_kit_as_today_s_example_does(folder: Path, tmp_path: Path) -> None:
    name, dist = entry_point(folder)
    if (name, dist) not in INSTALLED:
        pytest.skip(f"{dist} is not installed (make test installs it: pip install --no-deps ./{folder.name})")
    frozen, log = await kit(name, tmp_path)
    written = json.loads((HERE / "expected" / f"{folder.name}.json").read_text())["outcomes"]
    assert {rule: frozen.get(rule) for rule in written} == written  # rule by rule, as when it was written
    today, _ = await kit("echo", tmp_path)
    assert frozen == today  # and as today's example: passed, failed or not applicable alike
    assert "failed" not in frozen.values()
    assert sum(outcome == "passed" for outcome in frozen.values()) > 0
    assert f"backend {name!r} ({dist} " in log and "targets SPI revision" in log  # its deprecations, at load
    assert "broke the backend SPI" not in log and "Traceback" not in log


@pytest.mark.parametrize("folder", FROZEN, ids=lambda path: path.name)
async def test_backends_shows_a_frozen_plugin_served_through_the_compatibility_layer(folder: Path) -> None:
    name, dist = entry_point(folder)
    if (name, dist) not in INSTALLED:
        pytest.skip(f"{dist} is not installed (make test installs it: pip install --no-deps ./{folder.name})")
    revision = int(folder.name.removeprefix("spi").split("-")[0])
    process = await asyncio.create_subprocess_exec(*command(), "backends", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    lines = out.decode().splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{name} ")]
    assert f"  SPI {revision} (from its requirement openengine-gateway" in lines[index]
    assert lines[index].endswith(") compat")
    assert "deprecated: its generate returns an async iterator of events" in lines[index + 1]


@pytest.mark.parametrize("folder", FROZEN, ids=lambda path: path.name)
async def test_each_deprecation_is_logged_once_however_many_engines_use_the_plugin(
    folder: Path, tmp_path: Path
) -> None:
    name, dist = entry_point(folder)
    if (name, dist) not in INSTALLED:
        pytest.skip(f"{dist} is not installed (make test installs it: pip install --no-deps ./{folder.name})")
    config = tmp_path / "plugins.toml"
    config.write_text("".join(f'[[engines]]\nbackend = "{name}"\nserved_model_name = "{m}"\n\n' for m in "ab"))
    async with gateway_process("--config", str(config), cwd=tmp_path) as gateway:
        assert await gateway.stop() == 0
        log = gateway.log.read_text().splitlines()
    lines = [line.split(" WARNING ", 1)[1] for line in log if "targets SPI revision" in line]  # without the time
    assert lines and len(lines) == len(set(lines))
