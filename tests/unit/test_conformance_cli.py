"""``openengine-gateway conformance``: usage errors exit 2 with a message, before any rule runs; ``--layout``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway.conformance.cli import main
from openengine_gateway.testing import serve_backends


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


def test_an_unknown_layout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--target", "127.0.0.1:1", "--layout", "newest"])
    assert exited.value.code == 2 and "invalid choice: 'newest'" in capsys.readouterr().err


async def test_layout_picks_the_services_the_rules_are_asked_through(tmp_path: Path) -> None:
    """The same rules through each layout: identity is each layout's own, Drain exists only in the seed's."""
    rules = ["--rule", "engine-info.*", "--rule", "drain.waits-for-in-flight", "--rule", "generate.usage-final-only"]
    outcomes = {}
    async with serve_backends([("model", MockBackend(MockSettings(decode_time_per_step_s=0.002)))]) as running:
        for layout in ("seed", "later"):
            report = tmp_path / f"{layout}.json"
            argv = ["--target", running.address, "--layout", layout, *rules, "--json", str(report)]
            assert await asyncio.to_thread(main, argv) == 0  # the command runs its own event loop
            outcomes[layout] = {r["id"]: (r["outcome"], r["message"]) for r in json.loads(report.read_text())["rules"]}
    passed = ("passed", "")
    assert outcomes["seed"] == {
        "engine-info.schema-release": passed,
        "engine-info.schema-revision": passed,
        "drain.waits-for-in-flight": passed,
        "generate.usage-final-only": passed,
    }
    lacking = ("not_applicable", "the later layout has no Drain RPC")
    assert outcomes["later"] == {**outcomes["seed"], "drain.waits-for-in-flight": lacking}
