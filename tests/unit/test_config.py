"""``config``: plugins.toml is validated strictly, and every error names its key."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway.config import Config, engine_settings, load_config
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.routes import plan_routes
from openengine_gateway.spi import BackendSettings
from pydantic import Field


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plugins.toml"
    path.write_text(text)
    return path


def test_no_file_means_defaults() -> None:
    config = load_config(None)
    assert config == Config()
    assert config.plugins.allow is None
    assert (config.gateway.host, config.gateway.port) == ("127.0.0.1", 50051)
    assert config.engines == [] and config.backends == {}


def test_a_full_file(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """
            [plugins]
            allow = ["mock", "vllm"]

            [gateway]
            host = "0.0.0.0"
            port = 0
            advertise_host = "node-1"
            max_in_flight = 8
            drain_timeout_s = 0
            lora_roots = ["/adapters"]

            [backends.vllm]
            enforce_eager = true

            [[engines]]
            backend = "mock"
            served_model_name = "mock"
            aliases = ["default"]
            options = { model = "mock-model", seed = 3 }

            [[engines]]
            backend = "vllm"
            """,
        )
    )
    assert config.plugins.allow == ["mock", "vllm"]
    assert (config.gateway.host, config.gateway.port, config.gateway.advertise_host) == ("0.0.0.0", 0, "node-1")
    assert config.gateway.max_in_flight == 8 and config.gateway.drain_timeout_s == 0
    assert config.gateway.lora_roots == ["/adapters"]
    assert config.backends == {"vllm": {"enforce_eager": True}}
    assert [(e.backend, e.served_model_name, e.aliases, e.options) for e in config.engines] == [
        ("mock", "mock", ["default"], {"model": "mock-model", "seed": 3}),
        ("vllm", "", [], {}),
    ]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[gateway]\nbogus = 1", "gateway.bogus"),
        ("[gateway]\nport = 'x'", "gateway.port"),
        ("[gateway]\nport = 70000", "gateway.port"),
        ("[gateway]\nmax_in_flight = 0", "gateway.max_in_flight"),
        ("[gateway]\nsubscriber_queue = 0", "gateway.subscriber_queue"),
        ("[gateway]\nkv_replay_batches = 0", "gateway.kv_replay_batches"),
        ("[gateway]\nprobe_timeout_s = 0", "gateway.probe_timeout_s"),
        ("[gateway]\ndrain_timeout_s = -1", "gateway.drain_timeout_s"),
        ("[plugins]\nallow = 'mock'", "plugins.allow"),
        ("[plugins]\ndeny = []", "plugins.deny"),
        ("[[engines]]\nserved_model_name = 'x'", "engines.0.backend"),
        ("[[engines]]\nbackend = 'mock'\n[[engines]]\nbackend = 'mock'\nalias = ['a']", "engines.1.alias"),
        ("[backends]\nvllm = 3", "backends.vllm"),
        ("[server]\nport = 1", "server"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError) as raised:
        load_config(path)
    message = raised.value.args[0]
    assert message.startswith(f"{path}: invalid configuration")
    assert f"\n  {key}: " in message


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_config(write(tmp_path, "[gateway]\nport = 'x'\nhost = 1"))
    assert "gateway.port" in raised.value.args[0] and "gateway.host" in raised.value.args[0]


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_config(write(tmp_path, "[gateway\nport = 1"))
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[gateway]\nhost = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigurationError, match="not UTF-8 text"):
        load_config(latin1)


class Settings(BackendSettings):
    max_running_requests: int = Field(default=4, gt=0)
    enforce_eager: bool = False


def test_engine_settings_validate_with_the_driver_model() -> None:
    settings = engine_settings(Settings, {"model": "m", "max_running_requests": "8", "enforce_eager": "true"}, "src")
    assert isinstance(settings, Settings)
    assert (settings.model, settings.max_running_requests, settings.enforce_eager) == ("m", 8, True)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"max_running_requests": "many"}, "max_running_requests"),
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"enforce_eager": "perhaps"}, "enforce_eager"),
    ],
)
def test_engine_settings_errors_name_the_key(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        engine_settings(Settings, options, "engines[0] (fake) options")
    message = raised.value.args[0]
    assert message.startswith("engines[0] (fake) options: invalid configuration")
    assert f"\n  {key}: " in message


def test_relative_paths_resolve_against_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "deploy"
    folder.mkdir()
    path = write(
        folder,
        """
        [gateway]
        tls_cert_file = "tls/cert.pem"
        auth_token_file = "/etc/gateway/token"
        control_token_file = "~/control"
        lora_roots = ["adapters", "/srv/loras"]

        [backends.vllm]
        engine_args = { tokenizer = "./tok", download_dir = "cache", served = "a/b/c" }

        [[engines]]
        backend = "remote"
        options = { model = ".models/tiny", ca_file = "ca.pem", target = "unix:///run/oe.sock", token = "t" }

        [[engines]]
        backend = "vllm"
        options = { model = "org/hub-model" }
        """,
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(Path("deploy/plugins.toml"))
    assert path.parent == folder
    gateway = config.gateway
    assert gateway.tls_cert_file == folder / "tls/cert.pem"
    assert gateway.auth_token_file == Path("/etc/gateway/token")  # absolute: as given
    assert gateway.control_token_file == Path("~/control")  # the user's home: as given
    assert gateway.lora_roots == [str(folder / "adapters"), "/srv/loras"]
    engine_args = config.backends["vllm"]["engine_args"]
    # a path by its name or, for a model or tokenizer, by its value; any other option as given
    assert engine_args == {"tokenizer": str(folder / "tok"), "download_dir": str(folder / "cache"), "served": "a/b/c"}
    remote, hub = config.engines
    assert remote.options == {
        "model": str(folder / ".models/tiny"),
        "ca_file": str(folder / "ca.pem"),
        "target": "unix:///run/oe.sock",
        "token": "t",
    }
    assert hub.options == {"model": "org/hub-model"}  # a hub id is not a path


def test_command_line_paths_stay_relative_to_the_working_directory(tmp_path: Path) -> None:
    from openengine_gateway.config import with_flags

    config = load_config(write(tmp_path, "[gateway]\ntls_key_file = 'key.pem'\n"))
    flagged = with_flags(config.gateway, {"tls_cert_file": "cert.pem"})
    assert flagged.tls_cert_file == Path("cert.pem")
    assert flagged.tls_key_file == tmp_path / "key.pem"


def test_the_repository_s_commented_split_and_mirror_example_is_valid(tmp_path: Path) -> None:
    """plugins.toml's A/B example, uncommented, is a configuration the gateway accepts before any engine starts."""
    text = (Path(__file__).resolve().parents[2] / "plugins.toml").read_text()
    example = text.split("# [[engines]]", 1)[1]
    uncommented = "[[engines]]" + "\n".join(line.removeprefix("# ").removeprefix("#") for line in example.splitlines())
    path = tmp_path / "plugins.toml"
    path.write_text(text.split("# A/B on live traffic", 1)[0] + uncommented)
    config = load_config(path)
    assert [split.name for split in config.splits] == ["llama"] and config.mirrors[0].shadow == "mock"
    names = {engine.served_model_name: engine.served_model_name for engine in config.engines}
    plan = plan_routes(names, config.splits, config.mirrors)
    assert plan.splits[0][1] == ("tiny-llama", "mock") and plan.mirrors[0][1:] == ("tiny-llama", "mock")
    analysis = config.splits[0].analysis
    assert analysis is not None and (analysis.baseline, analysis.candidate, analysis.steps) == (
        "tiny-llama",
        "mock",
        [5, 25, 50, 100],
    )
    assert analysis.limits.ttft is not None and analysis.limits.ttft.max_ratio == 1.2
