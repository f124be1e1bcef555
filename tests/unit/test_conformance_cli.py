"""``openengine-gateway conformance``: usage errors exit 2 with a message, before any rule runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway.conformance.cli import main


def test_an_unreadable_ca_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "127.0.0.1:1", "--ca", str(tmp_path / "missing.pem")]) == 2
    assert "missing.pem" in capsys.readouterr().err


def test_a_rule_pattern_that_matches_nothing_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "127.0.0.1:1", "--rule", "nomatch*"]) == 2
    assert "no rule matches nomatch*" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ["0", "-1", "nan"])
def test_the_timeout_must_be_positive(seconds: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--target", "127.0.0.1:1", "--timeout", seconds])
    assert exited.value.code == 2
