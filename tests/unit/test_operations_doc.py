"""docs/operations.md says what the code does: what each scope reaches, and every bound with its default;
the README quotes the hostile-client module's test count."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from openengine_gateway.contract.bounds import FieldBounds
from openengine_gateway.server.auth import RPC_ACCESS, SCOPE_ACCESS, Access, Scope

DOC = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()


def _rows(first_cells: set[str]) -> dict[str, list[str]]:
    rows = {}
    for line in DOC.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in first_cells:
            rows[cells[0]] = cells
    return rows


def test_the_threat_model_lists_each_rpc_under_the_access_it_needs_and_each_scope_as_it_reaches() -> None:
    rows = _rows({access.value for access in Access})
    assert set(rows) == {access.value for access in Access}
    for access in Access:
        listed = {re.sub(r" of .*", "", name).strip() for name in rows[access.value][1].split(",")} - {"reflection"}
        expected = {rpc for rpc, needed in RPC_ACCESS.items() if needed is access}
        if access is Access.CONTROL:
            expected.add("Abort")  # of all requests
        assert listed == expected, access
        for column, scope in enumerate((Scope.INFERENCE, Scope.OBSERVER, Scope.CONTROL), start=2):
            assert rows[access.value][column].startswith("yes") == (access in SCOPE_ACCESS[scope]), (access, scope)


def test_every_bound_is_documented_with_its_default() -> None:
    rows = _rows({f"`--{name.replace('_', '-')}`" for name in FieldBounds.__dataclass_fields__})
    for name in FieldBounds.__dataclass_fields__:
        row = rows[f"`--{name.replace('_', '-')}`"]
        assert int(row[1]) == getattr(FieldBounds(), name), name


def test_the_readme_quotes_the_hostile_client_modules_test_count() -> None:
    root = Path(__file__).parents[2]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/ops/test_hostile.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    count = int(re.search(r"(\d+) tests? collected", collected).group(1))  # type: ignore[union-attr]
    assert f"(`tests/ops/test_hostile.py`, {count} tests)" in (root / "README.md").read_text()
