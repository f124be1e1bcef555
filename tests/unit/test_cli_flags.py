"""``cli``: driver flags, engine sections from the command line, and the entry point's exits."""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from openengine_gateway import cli
from openengine_gateway.config import Config, CoreSettings, EngineSection, GatewaySection, flag_of
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.errors import (
    CapabilityError,
    ConfigurationError,
    EngineStartError,
    PluginError,
    SetupError,
)
from openengine_gateway.plugins import InstalledBackend
from openengine_gateway.spi import SPI_VERSION


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], {}),
        (["--max-running-requests", "8"], {"max_running_requests": "8"}),
        (["--dtype=bfloat16"], {"dtype": "bfloat16"}),
        (["--enforce-eager"], {"enforce_eager": True}),
        (["--enforce-eager", "--seed", "3"], {"enforce_eager": True, "seed": "3"}),
        (["--temperature", "-1"], {"temperature": "-1"}),
        (["--suffix="], {"suffix": ""}),
        (["--expr=a=b"], {"expr": "a=b"}),
        (["--device", "0", "--device", "1"], {"device": ["0", "1"]}),
        (["--device=0", "--device", "1", "--device"], {"device": ["0", "1", True]}),
    ],
)
def test_parse_driver_flags(tokens: list[str], expected: dict[str, Any]) -> None:
    assert cli.parse_driver_flags(tokens) == expected


@pytest.mark.parametrize("tokens", [["model"], ["--seed", "3", "extra"], ["--"], ["-x", "1"], ["--=3"]])
def test_parse_driver_flags_rejects_stray_arguments(tokens: list[str]) -> None:
    with pytest.raises(ConfigurationError, match="driver options look like --name value"):
        cli.parse_driver_flags(tokens)


def args(*argv: str) -> tuple[argparse.Namespace, list[str]]:
    return cli._parser().parse_known_args(list(argv))


def test_engine_from_the_command_line() -> None:
    namespace, extra = args(
        "--backend",
        "mock",
        "--model",
        "m1",
        "--served-model-name",
        "chat",
        "--alias",
        "a",
        "--alias",
        "b",
        "--seed",
        "7",
    )
    (section,) = cli._engine_sections(namespace, extra, Config(engines=[EngineSection(backend="ignored")]))
    assert section == EngineSection(
        backend="mock", served_model_name="chat", aliases=["a", "b"], options={"seed": "7", "model": "m1"}
    )


def test_engines_from_the_config_without_backend() -> None:
    config = Config(engines=[EngineSection(backend="mock"), EngineSection(backend="vllm")])
    namespace, extra = args()
    assert cli._engine_sections(namespace, extra, config) == config.engines


@pytest.mark.parametrize("argv", [["--model", "m"], ["--alias", "a"], ["--served-model-name", "n"], ["--seed", "1"]])
def test_engine_options_need_a_backend(argv: list[str]) -> None:
    namespace, extra = args(*argv)
    with pytest.raises(ConfigurationError, match="need --backend"):
        cli._engine_sections(namespace, extra, Config())


def test_config_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENENGINE_GATEWAY_CONFIG", raising=False)
    assert cli._config_path(None) is None
    (tmp_path / "plugins.toml").write_text("")
    assert cli._config_path(None) == Path("plugins.toml")
    monkeypatch.setenv("OPENENGINE_GATEWAY_CONFIG", "/etc/oe.toml")
    assert cli._config_path(None) == Path("/etc/oe.toml")
    assert cli._config_path(Path("x.toml")) == Path("x.toml")


@pytest.mark.parametrize(("host", "routable"), [("127.0.0.1", "127.0.0.1"), ("node-1", "node-1")])
def test_routable_keeps_a_concrete_host(host: str, routable: str) -> None:
    assert cli._routable(host) == routable


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "[::]"])
def test_routable_replaces_a_wildcard(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getfqdn", lambda *_: "node-1.example")  # no name lookup in unit tests
    assert cli._routable(host) == "node-1.example"


def test_backends_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(
        cli,
        "installed_backends",
        lambda: [
            InstalledBackend("mock", "pkg.mock:Mock", "openengine-gateway", "0.2.0"),
            InstalledBackend("vllm", "no_such_module_x:Y", "third", "2"),
        ],
    )
    assert cli.main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"mock  openengine-gateway 0.2.0  (pkg.mock:Mock)  SPI {SPI_VERSION} (in tree) native",  # not imported
        "vllm  third 2  (no_such_module_x:Y)  SPI ? (unknown) refused: it fails to import: "
        "ModuleNotFoundError: No module named 'no_such_module_x'",
    ]
    monkeypatch.setattr(cli, "installed_backends", list)
    assert cli.main(["backends"]) == 1
    assert "no backends installed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "error", [ConfigurationError("bad key"), PluginError("no such backend"), OSError("port in use")]
)
def test_startup_errors_exit_2_with_the_message(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[argparse.Namespace] = []

    def failing_run(coroutine: Coroutine[Any, Any, int]) -> int:
        coroutine.close()
        raise error

    real_serve = cli.serve

    def serve(namespace: argparse.Namespace, extra: list[str], frontend: object = None) -> Coroutine[Any, Any, int]:
        seen.append(namespace)
        return real_serve(namespace, extra)

    monkeypatch.setattr(cli, "_run", failing_run)
    monkeypatch.setattr(cli, "serve", serve)
    assert cli.main(["serve", "--backend", "mock", "--port", "0"]) == 2
    assert capsys.readouterr().err == f"openengine-gateway: error: {error}\n"
    assert seen[0].backend == "mock" and seen[0].port == 0  # "serve" is optional and stripped


def test_startup_objects_are_frozen_out_of_full_collections() -> None:
    import gc

    kept = [[index] for index in range(10_000)]  # long-lived objects made while starting
    try:
        frozen = cli.freeze_startup_objects()
        # Not equal to a later gc.get_freeze_count(): threads left by earlier tests (a vLLM engine's)
        # may free frozen objects in between, which lowers it.
        assert frozen >= len(kept)
        collected = {id(obj) for obj in gc.get_objects()}  # what a full collection walks
        assert not any(id(item) in collected for item in kept)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--port", "70000"], "port"),
        (["--port", "-1"], "port"),
        (["--max-message-bytes", "-1"], "max_message_bytes"),
        (["--max-message-bytes", "0"], "max_message_bytes"),
        (["--max-in-flight", "0"], "max_in_flight"),
        (["--max-task-items", "-3"], "max_task_items"),
        (["--drain-timeout", "-1"], "drain_timeout_s"),
        (["--drain-timeout", "nan"], "drain_timeout_s"),
        (["--metrics-port", "70000"], "metrics_port"),
        (["--max-in-flight-per-token", "0"], "max_in_flight_per_token"),
        (["--max-id-chars", "0"], "max_id_chars"),
        (["--max-stop-conditions", "-1"], "max_stop_conditions"),
        (["--max-memory-mib", "0"], "max_memory_mib"),
        (["--max-health-watches", "0"], "max_health_watches"),
        (["--max-health-watches-per-connection", "0"], "max_health_watches_per_connection"),
        (["--max-streams-per-connection", "0"], "max_streams_per_connection"),
        (["--max-probes-per-s", "0"], "max_probes_per_s"),
        (["--max-unread-per-stream", "0"], "max_unread_per_stream"),
        (["--max-unread-per-caller", "-1"], "max_unread_per_caller"),
    ],
)
def test_a_flag_takes_exactly_the_values_its_config_key_does(argv: list[str], key: str) -> None:
    namespace, _ = args(*argv)
    with pytest.raises(ConfigurationError, match=f"command line: invalid configuration\n  {key}: "):
        cli._gateway_section(namespace, Config())


def test_flags_override_the_config_file() -> None:
    namespace, _ = args("--port", "0", "--max-in-flight", "8", "--lora-root", "/a")
    section = cli._gateway_section(namespace, Config.model_validate({"gateway": {"port": 9, "max_subscriptions": 3}}))
    assert (section.port, section.max_in_flight, section.max_subscriptions, section.lora_roots) == (0, 8, 3, ["/a"])


def test_an_unknown_log_level_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--backend", "mock", "--log-level", "bogus"])
    assert exited.value.code == 2 and "--log-level" in capsys.readouterr().err
    monkeypatch.setenv("OPENENGINE_LOG_LEVEL", "bogus")  # a default argparse does not check
    assert cli.main(["--backend", "mock"]) == 2
    assert "--log-level" in capsys.readouterr().err


def test_a_signal_during_startup_stops_the_gateway_once_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine is left half started: the stop waits for the startup it interrupted."""
    import os
    import signal
    import threading
    import time

    from openengine_gateway import launch

    real_start = launch.start_engines

    async def slow_start(*arguments: Any, **options: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the engines start
        await asyncio.sleep(0.1)
        return await real_start(*arguments, **options)

    monkeypatch.setattr(cli, "start_engines", slow_start)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # unhandled, it would end pytest itself
    backstop = threading.Timer(10, os.kill, (os.getpid(), signal.SIGTERM))  # a lost signal: stop it anyway
    backstop.start()
    started = time.monotonic()
    try:
        assert cli.main(["--backend", "mock", "--port", "0", "--drain-timeout", "0"]) == 0
    finally:
        backstop.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - started < 5, "the signal during startup was lost"


def test_an_engine_that_fails_to_start_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def failing_start(*arguments: Any, **options: Any) -> Any:
        raise EngineStartError("engine 'm' (mock) failed to start: RuntimeError: no device")

    monkeypatch.setattr(cli, "start_engines", failing_start)
    assert cli.main(["--backend", "mock", "--port", "0"]) == 1
    assert (
        capsys.readouterr().err
        == "openengine-gateway: error: engine 'm' (mock) failed to start: RuntimeError: no device\n"
    )


def test_a_signal_that_also_stops_the_starting_engine_stops_the_gateway_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in a terminal reaches the engine's own processes too: their failure is the stop, not an error."""
    import os
    import signal

    async def interrupted_start(*arguments: Any, **options: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.1)  # the handler runs
        raise EngineStartError("engine 'm' (mock) failed to start: RuntimeError: cancelled")

    monkeypatch.setattr(cli, "start_engines", interrupted_start)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        assert cli.main(["--backend", "mock", "--port", "0"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "openengine-gateway: error" not in capsys.readouterr().err


def test_every_bound_is_a_flag_and_a_key_with_the_gateways_default() -> None:
    from openengine_gateway.contract.bounds import FieldBounds

    section = cli._gateway_section(args()[0], Config())
    for name in FieldBounds.__dataclass_fields__:
        default = getattr(FieldBounds(), name)
        assert getattr(section, name) == getattr(GatewayOptions(), name) == default, name
        flag = "--" + name.replace("_", "-")
        assert getattr(cli._gateway_section(args(flag, "7")[0], Config()), name) == 7, flag


def test_metrics_stay_on_loopback_whatever_the_grpc_host(caplog: pytest.LogCaptureFixture) -> None:
    options = cli._server_options(cli._gateway_section(args("--host", "0.0.0.0", "--metrics-port", "0")[0], Config()))
    assert (options.host, options.metrics_host, options.metrics_tls) == ("0.0.0.0", "127.0.0.1", False)
    cli._server_options(cli._gateway_section(args("--metrics-host", "0.0.0.0", "--metrics-port", "0")[0], Config()))
    assert "metrics on 0.0.0.0 in plaintext" in caplog.text
    with pytest.raises(ConfigurationError, match="--metrics-tls serves the gateway's certificate"):
        cli._server_options(cli._gateway_section(args("--metrics-tls")[0], Config()))


def _file_only_keys_in_the_docs() -> dict[str, tuple[float, str]]:
    """The ``Tuning keys (plugins.toml only)`` table of docs/operations.md: key -> (default, meaning)."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    table = text.split("## Tuning keys (plugins.toml only)", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| `")]
    return {key.strip().strip("`"): (float(default), meaning.strip()) for key, default, meaning in rows}


def test_every_gateway_key_is_a_flag_with_the_key_s_default_or_a_documented_file_only_key() -> None:
    """The flags are derived from ``GatewaySection``: none is missing, none has a default of its own."""
    parser = cli._parser()
    by_dest = {action.dest: action for action in parser._actions}
    file_only: dict[str, tuple[object, str | None]] = {}
    for key, field in GatewaySection.model_fields.items():
        flag = flag_of(field)
        if flag is None:
            file_only[key] = (field.default, field.description)
            continue
        action = by_dest[key]
        assert action.option_strings == [flag.spelled(key)], key
        assert action.default is None, key  # "not given": the file's value or the key's default applies
        if field.default not in (None, False, []):
            assert f"(default {field.default})" in (action.help or ""), key
    assert _file_only_keys_in_the_docs() == file_only
    assert cli._gateway_section(args()[0], Config()) == GatewaySection()


def test_the_core_s_options_are_its_gateway_keys() -> None:
    """``GatewayOptions`` holds no default of its own: each core key is the section's."""
    section = GatewaySection()
    options = GatewayOptions()
    for key in CoreSettings.model_fields:
        assert getattr(options, key) == getattr(section, key), key
    assert set(GatewayOptions.model_fields) - set(CoreSettings.model_fields) == {"advertise_host", "instance_id"}


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigurationError("bad key"), 2),
        (PluginError("no such backend"), 2),
        (EngineStartError("engine 'm' (mock) failed to start: RuntimeError: no device"), 1),
        (CapabilityError("ModelInfo.max_context_length is reported as 0; limits must be > 0"), 1),
    ],
)
def test_a_setup_error_s_class_carries_its_exit_code(
    error: SetupError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing_run(coroutine: Coroutine[Any, Any, int]) -> int:
        coroutine.close()
        raise error

    monkeypatch.setattr(cli, "_run", failing_run)
    assert error.exit_code == code
    assert cli.main(["--backend", "mock", "--port", "0"]) == code
    assert capsys.readouterr().err == f"openengine-gateway: error: {error}\n"


def test_the_overload_flags_reach_the_server_and_the_core() -> None:
    flags = ["--max-memory-mib", "512", "--max-health-watches", "9", "--max-health-watches-per-connection", "3"]
    flags += ["--max-streams-per-connection", "64", "--max-probes-per-s", "0.5"]
    flags += ["--max-unread-per-stream", "100", "--max-unread-per-caller", "400"]
    section = cli._gateway_section(args(*flags)[0], Config())
    server = cli._server_options(section)
    assert (server.max_health_watches, server.max_health_watches_per_connection) == (9, 3)
    assert server.max_streams_per_connection == 64
    assert (section.max_memory_mib, section.max_probes_per_s) == (512, 0.5)
    assert (section.max_unread_per_stream, section.max_unread_per_caller) == (100, 400)
