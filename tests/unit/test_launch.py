"""``launch``: configuration to started engines, all-or-nothing."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import ClassVar

import pytest
from openengine_gateway import launch
from openengine_gateway.config import Config, EngineSection, MirrorSection, PluginsSection, SplitSection, load_config
from openengine_gateway.errors import CapabilityError, ConfigurationError, EngineStartError
from openengine_gateway.plugins import InstalledBackend
from openengine_gateway.spi import Backend, BackendSettings, EngineFacts
from pydantic import Field

from tests.fakes import FakeBackend


class Settings(BackendSettings):
    seed: int = 0
    max_running_requests: int = Field(default=4, gt=0)


class Driver(FakeBackend):
    Settings = Settings
    started_order: ClassVar[list[str]] = []
    fail_start: ClassVar[set[str]] = set()

    async def start(self) -> EngineFacts:
        if self.settings.model in self.fail_start:
            raise RuntimeError(f"cannot start {self.settings.model}")
        Driver.started_order.append(self.settings.model)
        return await super().start()


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Collection[str] | None]]:
    calls: list[tuple[str, Collection[str] | None]] = []

    def load_backend(name: str, allowed: Collection[str] | None = None) -> type[Backend]:
        calls.append((name, allowed))
        return Driver

    monkeypatch.setattr(launch, "load_backend", load_backend)
    monkeypatch.setattr(launch, "installed_backends", lambda: [InstalledBackend("fake", "tests:Driver", "tests", "0")])
    monkeypatch.setattr(Driver, "started_order", [])
    monkeypatch.setattr(Driver, "fail_start", set())
    return calls


def test_options_overlay_backend_defaults(loaded: list[tuple[str, Collection[str] | None]]) -> None:
    config = Config(plugins=PluginsSection(allow=["fake"]), backends={"fake": {"seed": 1, "max_running_requests": 2}})
    (plan,) = launch.plan_engines([EngineSection(backend="fake", options={"model": "m", "seed": "9"})], config)
    assert isinstance(plan.backend, Driver)
    assert plan.backend.settings == Settings(model="m", seed=9, max_running_requests=2)
    assert loaded == [("fake", ["fake"])]  # the allowlist reaches the loader


@pytest.mark.parametrize(
    ("section", "served"),
    [
        (EngineSection(backend="fake", served_model_name="chat", options={"model": "m"}), "chat"),
        (EngineSection(backend="fake", options={"model": "org/m"}), "org/m"),
        (EngineSection(backend="fake"), "fake"),
    ],
)
def test_served_name_fallbacks(loaded: object, section: EngineSection, served: str) -> None:
    (plan,) = launch.plan_engines([section], Config())
    assert plan.served_name == served


def test_invalid_options_name_the_engine_and_key(loaded: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines(
            [EngineSection(backend="fake"), EngineSection(backend="fake", options={"bogus": 1})], Config()
        )
    assert raised.value.args[0].startswith("engines[1] (fake) options: invalid configuration")
    assert "\n  bogus: " in raised.value.args[0]


def test_the_command_line_s_engine_is_named_as_given(loaded: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines([EngineSection(backend="fake", options={"bogus": 1})], Config(), command_line=True)
    assert raised.value.args[0].startswith("--backend fake options: invalid configuration\n  bogus: ")


def test_an_option_from_backend_defaults_is_named_where_it_was_set(loaded: object) -> None:
    config = Config(backends={"fake": {"sede": 1, "seed": 2}})
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines([EngineSection(backend="fake", options={"seed": "x"})], config)
    lines = {line.split(":")[0].strip(): line for line in raised.value.args[0].splitlines()[1:]}
    assert lines["sede"] == "  sede: Extra inputs are not permitted (set in [backends.fake]; did you mean 'seed'?)"
    assert lines["seed"].startswith("  seed: Input should be a valid integer") and "(set in" not in lines["seed"]


def test_a_check_across_options_names_no_empty_key(loaded: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import model_validator

    class Checked(Settings):
        @model_validator(mode="after")
        def _bounded(self) -> Checked:
            if self.seed > self.max_running_requests:
                raise ValueError("seed must not exceed max_running_requests")
            return self

    monkeypatch.setattr(Driver, "Settings", Checked)
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines([EngineSection(backend="fake", options={"seed": 9})], Config())
    assert raised.value.args[0].endswith("options: invalid configuration\n  seed must not exceed max_running_requests")


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            [
                EngineSection(backend="fake", served_model_name="a"),
                EngineSection(backend="fake", served_model_name="a"),
            ],
            "engines[1] (fake): model name 'a' is served twice (also by engines[0] (fake))",
        ),
        (
            [
                EngineSection(backend="fake", served_model_name="a", aliases=["b"]),
                EngineSection(backend="fake", served_model_name="b"),
            ],
            "engines[1] (fake): model name 'b' is served twice (also by engines[0] (fake))",
        ),
        (
            [EngineSection(backend="fake", served_model_name="a", aliases=["a"])],
            "engines[0] (fake): model alias 'a' is served twice (also by engines[0] (fake))",
        ),
    ],
)
def test_a_name_served_twice_is_refused_before_anything_starts(
    loaded: object, sections: list[EngineSection], message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines(sections, Config())
    assert raised.value.args[0] == message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            Config(backends={"fak": {"seed": 1}}),
            "[backends.fak]: no installed backend is called 'fak' (installed: fake)",
        ),
        (
            Config(plugins=PluginsSection(allow=["fake"]), backends={"other": {}}),
            "[backends.other]: 'other' is not in [plugins] allow (fake)",
        ),
    ],
)
def test_a_backend_table_for_no_loadable_backend_is_a_typo(loaded: object, config: Config, message: str) -> None:
    """Its defaults would be dropped without a word."""
    with pytest.raises(ConfigurationError) as raised:
        launch.plan_engines([EngineSection(backend="fake")], config)
    assert raised.value.args[0] == message


async def test_a_split_or_mirror_naming_no_engine_is_refused_before_anything_starts(loaded: object) -> None:
    sections = [EngineSection(backend="fake", served_model_name=name, options={"model": name}) for name in "ab"]
    Driver.started_order.clear()
    for config, message in (
        (
            Config(splits=[SplitSection(name="s", engines={"a": 1, "bb": 1})]),
            "splits[0] (s): no engine is served as 'bb' (engines: a, b)",
        ),
        (Config(mirrors=[MirrorSection(name="a", shadow="c")]), "mirrors[0] (a -> c): no engine is served as 'c'"),
    ):
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            await launch.start_engines(sections, config)
    assert Driver.started_order == []


def test_no_engine(loaded: object) -> None:
    with pytest.raises(ConfigurationError, match="no engine to serve"):
        launch.plan_engines([], Config())


async def test_start_engines(loaded: object) -> None:
    sections = [
        EngineSection(backend="fake", served_model_name="a", aliases=["x"], options={"model": "m1"}),
        EngineSection(backend="fake", served_model_name="b", options={"model": "m2"}),
    ]
    engines = await launch.start_engines(sections, Config())
    assert engines.served_names == ["a", "x", "b"]
    assert Driver.started_order == ["m1", "m2"]


async def test_a_failed_start_stops_the_engines_already_started(
    loaded: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    Driver.fail_start = {"m3"}
    sections = [
        EngineSection(backend="fake", served_model_name=name, options={"model": model})
        for name, model in [("a", "m1"), ("b", "m2"), ("c", "m3")]
    ]
    plans = launch.plan_engines(sections, Config())
    monkeypatch.setattr(launch, "plan_engines", lambda *_, **__: plans)  # keep hold of the backends
    with pytest.raises(EngineStartError, match=r"engine 'c' \(fake\) failed to start: RuntimeError: cannot start m3"):
        await launch.start_engines(sections, Config())
    assert [plan.backend.stopped for plan in plans] == [True, True, False]  # type: ignore[attr-defined]


@pytest.mark.parametrize("error", [ConfigurationError, FileNotFoundError])
async def test_a_configuration_error_from_start_stays_one(
    loaded: object, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """A driver that finds its options unusable only when starting is still the user's to fix (exit 2)."""

    async def refuse(self: Driver) -> EngineFacts:
        raise error("model path does not exist")

    monkeypatch.setattr(Driver, "start", refuse)
    with pytest.raises(error, match="model path does not exist"):
        await launch.start_engines([EngineSection(backend="fake", options={"model": "m"})], Config())


async def test_a_configuration_error_from_start_names_the_engine(
    loaded: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the guide promises: the engine's label comes first, as for an option its settings refuse."""

    async def refuse(self: Driver) -> EngineFacts:
        raise ConfigurationError("corpus: no such file")

    monkeypatch.setattr(Driver, "start", refuse)
    sections = [
        EngineSection(backend="fake", options={"model": "a"}),
        EngineSection(backend="fake", options={"model": "b"}),
    ]
    with pytest.raises(ConfigurationError, match=re.escape("engines[0] (fake): corpus: no such file")):
        await launch.start_engines(sections, Config())
    with pytest.raises(ConfigurationError, match=re.escape("--backend fake: corpus: no such file")):
        await launch.start_engines(sections[:1], Config(), command_line=True)


class PathSettings(BackendSettings):
    corpus: Path = Path("corpus.txt")
    extra: Path | None = None
    label: str = ""


class PathDriver(Driver):
    Settings = PathSettings  # type: ignore[assignment]


def test_a_path_typed_option_is_relative_to_the_file(
    loaded: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(launch, "load_backend", lambda _name, _allowed=None: PathDriver)
    (tmp_path / "plugins.toml").write_text(
        '[backends.fake]\nextra = "more"\n[[engines]]\nbackend = "fake"\n'
        'options = { corpus = "data/c.txt", label = "data/x" }\n'
    )
    config = load_config(tmp_path / "plugins.toml")
    (plan,) = launch.plan_engines(config.engines, config)
    settings = plan.backend.settings
    assert (settings.corpus, settings.extra) == (tmp_path / "data/c.txt", tmp_path / "more"), "typed Path: anchored"
    assert settings.label == "data/x", "a str option keeps its value"
    flags = EngineSection(backend="fake", options={"corpus": "c.txt"})
    (flagged,) = launch.plan_engines([flags], config, command_line=True)
    assert flagged.backend.settings.corpus == Path("c.txt"), "a command-line value stays relative to the working dir"
    assert flagged.backend.settings.extra == tmp_path / "more", "a [backends] default is the file's"


async def test_an_engine_it_cannot_reach_failed_to_start(loaded: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost connection is an OSError, but an engine that is not answering is not the user's typo (exit 1)."""

    async def unreachable(self: Driver) -> EngineFacts:
        raise ConnectionError("the remote OpenEngine server h:1 is not answering")

    monkeypatch.setattr(Driver, "start", unreachable)
    with pytest.raises(EngineStartError, match=r"failed to start: ConnectionError: the remote .* not answering"):
        await launch.start_engines([EngineSection(backend="fake", options={"model": "m"})], Config())


async def test_an_engine_whose_table_is_refused_is_stopped_too(loaded: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that started but advertises a table breaking the contract is not left running."""
    sections = [
        EngineSection(backend="fake", served_model_name=name, options={"model": model})
        for name, model in [("a", "m1"), ("b", "m2")]
    ]
    plans = launch.plan_engines(sections, Config())
    plans[1].backend.facts.model.max_context_length = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(launch, "plan_engines", lambda *_, **__: plans)
    with pytest.raises(CapabilityError, match="max_context_length"):
        await launch.start_engines(sections, Config())
    assert [plan.backend.stopped for plan in plans] == [True, True]  # type: ignore[attr-defined]
