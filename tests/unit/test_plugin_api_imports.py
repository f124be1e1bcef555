"""In-tree drivers and the example plugin reach the gateway only through the plugin API, as any
third-party plugin must: a driver that imports more works here and breaks the day that module moves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_API = ("spi", "errors", "pb", "client", "conformance", "testing")
"""The modules of ``openengine_gateway`` a plugin may import (each with its submodules)."""
ROOT_NAMES = frozenset({"__version__", *PLUGIN_API})
"""What ``from openengine_gateway import ...`` may take."""
SOURCES = sorted([*(ROOT / "backends").rglob("*.py"), *(ROOT / "examples").rglob("*.py")])


def outside_the_plugin_api(path: Path) -> list[str]:
    """The imports of ``openengine_gateway`` in ``path`` that name anything but the plugin API."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "openengine_gateway":
                found += [f"line {node.lineno}: {a.name}" for a in node.names if a.name not in ROOT_NAMES]
                continue
            modules = [node.module]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "openengine_gateway" and (len(parts) < 2 or parts[1] not in PLUGIN_API):
                found.append(f"line {node.lineno}: {module}")
    return found


def test_the_drivers_and_the_example_are_found() -> None:
    names = {path.relative_to(ROOT).parts[1] for path in SOURCES}
    assert {"mock", "vllm", "sglang", "trtllm", "remote", "openengine-echo-backend"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_driver_imports_only_the_plugin_api(path: Path) -> None:
    assert outside_the_plugin_api(path) == []


def test_the_check_catches_what_it_should(tmp_path: Path) -> None:
    source = tmp_path / "driver.py"
    source.write_text(
        "import openengine_gateway.core\n"
        "from openengine_gateway import config, pb, spi\n"
        "from openengine_gateway.engines import ConfigurationError\n"
        "from openengine_gateway.spi.zmq_kv import subscribe\n"
        "from .local import thing\n"
    )
    assert outside_the_plugin_api(source) == [
        "line 1: openengine_gateway.core",
        "line 2: config",
        "line 3: openengine_gateway.engines",
    ]
