"""A misspelt backend or option is named with the closest right one; ``backends`` says what cannot start here."""

from __future__ import annotations

import pytest
from openengine_gateway import cli
from openengine_gateway.plugins import InstalledBackend
from openengine_gateway.spi import SPI_VERSION


def test_an_option_without_a_backend_is_unknown_with_the_closest_gateway_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--prot", "50052", "--tls-crt=x", "--zzzz"]) == 2
    assert capsys.readouterr().err == (
        "openengine-gateway: error: unknown options (driver options need --backend):\n"
        "  --prot: did you mean '--port'?\n"
        "  --tls-crt: did you mean '--tls-cert'?\n"
        "  --zzzz\n"
    )


def test_a_driver_option_typo_gets_the_closest_gateway_flag_or_driver_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--backend", "mock", "--prot", "1", "--max-runing-requests", "8", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "  prot: Extra inputs are not permitted (did you mean '--port'?)" in err
    assert "  max_runing_requests: Extra inputs are not permitted (did you mean '--max-running-requests'?)" in err


def test_an_unknown_backend_gets_the_closest_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--backend", "mokc", "--port", "0"]) == 2
    assert "unknown backend 'mokc' (did you mean 'mock'?); installed backends: " in capsys.readouterr().err


def test_backends_says_which_cannot_start_here_and_what_installs_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    backends = [
        InstalledBackend("mock", "m:M", "openengine-gateway", "1"),
        InstalledBackend("sglang", "s:S", "openengine-gateway", "1"),
    ]
    monkeypatch.setattr(cli, "installed_backends", lambda: backends)
    monkeypatch.setattr(cli, "missing_packages", lambda b: ("sglang",) if b.name == "sglang" else ())
    assert cli.main(["backends"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"mock    openengine-gateway 1  (m:M)  SPI {SPI_VERSION} (in tree) native",
        f"sglang  openengine-gateway 1  (s:S)  SPI {SPI_VERSION} (in tree) native  "
        "cannot start here: needs sglang; pip install 'openengine-gateway[sglang]'",
    ]
