"""Operations proofs: shared certificates, and the figures the proofs measure.

Each proof records what it measured (``figures.record``): inputs tried, streams cancelled,
memory held. The figures are printed after the run in an "operations figures" section, and
written as JSON to ``$OPENENGINE_FIGURES_JSON`` when that is set, for the README.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.ops.certs import Certificates, issue_certificates


class Figures:
    """Named measurements of this run, in the order they were recorded."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def record(self, name: str, value: object) -> None:
        """Keep ``value`` under ``name`` (a later value replaces an earlier one)."""
        self.values[name] = value


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    """The run's figures recorder."""
    return FIGURES


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A CA, a server and a client certificate it signed, and a client signed by another CA."""
    return issue_certificates(tmp_path_factory.mktemp("certs"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES.values:
        return
    terminalreporter.section("operations figures")
    for name, value in FIGURES.values.items():
        terminalreporter.write_line(f"{name}: {value}")
    target = os.environ.get("OPENENGINE_FIGURES_JSON")
    if target:
        Path(target).write_text(json.dumps(FIGURES.values, indent=2, default=str) + "\n")
