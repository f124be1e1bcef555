"""``--help`` of every command: the subcommands listed, each command named as invoked, exit codes stated."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from openengine_gateway import cli, launch
from openengine_gateway.client.connection_options import add_connection_options, connect_options
from openengine_gateway.config import Config
from openengine_gateway.conformance.cli import main as conformance


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_subcommand_with_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(["--help"], capsys)
    for name, line in cli.COMMANDS.items():
        assert f"  {name:<12} {line}\n" in text
    assert "2 on a usage error" in text


def test_serve_help_names_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert help_of(["serve", "--help"], capsys).startswith("usage: openengine-gateway serve [options]")


def test_backends_help_is_help_not_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(["backends", "--help"], capsys)
    assert text.startswith("usage: openengine-gateway backends") and "openengine_backends.mock" not in text


def test_conformance_help_states_exit_codes_and_the_connection_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        conformance(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1 when a rule failed, 2 on a usage error or when the target cannot be reached" in text
    for flag in ("--token", "--ca FILE", "--tls "):
        assert flag in text


def test_connection_options_become_connect_keywords(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_connection_options(parser)
    (tmp_path / "ca.pem").write_bytes(b"PEM")
    args = parser.parse_args(["--token", "t", "--ca", str(tmp_path / "ca.pem")])
    assert connect_options(args) == {"token": "t", "root_certificates": b"PEM", "tls": False}
    assert connect_options(parser.parse_args(["--tls"])) == {"token": None, "root_certificates": None, "tls": True}


@pytest.mark.parametrize(("given", "level"), [("debug", "DEBUG"), ("WARNING", "WARNING")])
def test_log_level_is_one_of_the_levels_in_any_case(given: str, level: str) -> None:
    assert cli._parser().parse_known_args(["--log-level", given])[0].log_level == level


def test_the_readme_s_driver_option_example_is_the_mock_s() -> None:
    namespace, extra = cli._parser().parse_known_args(["--backend", "mock", "--max-running-requests", "8"])
    (plan,) = launch.plan_engines(cli._engine_sections(namespace, extra, Config()), Config(), command_line=True)
    assert plan.backend.settings.max_running_requests == 8  # type: ignore[attr-defined]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "--backend mock --max-running-requests 8" in readme
