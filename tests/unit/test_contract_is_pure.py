"""``contract`` holds pure rules and values: no module of it imports grpc, asyncio, or a layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CONTRACT = Path(__file__).resolve().parents[2] / "gateway" / "contract"
FORBIDDEN = ("asyncio", "grpc", "openengine_gateway.core", "openengine_gateway.server", "openengine_gateway.engines")


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved against ``openengine_gateway.contract``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ["openengine_gateway", "contract"][: 2 - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(CONTRACT.glob("*.py")), ids=lambda path: path.name)
def test_a_contract_module_imports_nothing_stateful(path: Path) -> None:
    bad = sorted(name for name in imported(path) if any(name == f or name.startswith(f"{f}.") for f in FORBIDDEN))
    assert bad == []
