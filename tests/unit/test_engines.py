"""``engines``: served names, aliases and routing of a request's ``model``."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.engines import Engine, EngineSet
from openengine_gateway.errors import CapabilityError, ConfigurationError, InvalidArgument, NotFound
from openengine_gateway.spi import BackendSettings

from tests.fakes import FakeBackend, engine, engine_set


def test_served_names_and_aliases_route() -> None:
    first, second = FakeBackend(), FakeBackend()
    engines = engine_set((first, "llama", ["default", "l"]), (second, "qwen"))
    assert engines.served_names == ["llama", "default", "l", "qwen"]
    assert engines.route("llama").engines == (engines.engine("llama"),)
    assert engines.engine("llama").backend is first
    assert engines.route("l").pick().backend is first
    assert engines.route("qwen").pick().backend is second
    assert len(engines) == 2 and [e.backend for e in engines] == [first, second]


def test_unknown_model_is_not_found_and_lists_served_names() -> None:
    engines = engine_set((FakeBackend(), "llama", ["default"]), (FakeBackend(), "qwen"))
    with pytest.raises(NotFound, match=r"'gpt' is not served here; served models: \['llama', 'default', 'qwen'\]"):
        engines.route("gpt")


def test_empty_model_only_with_one_engine() -> None:
    backend = FakeBackend()
    single = engine_set(backend)
    assert single.route("").pick().backend is backend
    with pytest.raises(InvalidArgument, match="model is required"):
        single.route("", required=True)
    several = engine_set((FakeBackend(), "a"), (FakeBackend(), "b"))
    with pytest.raises(InvalidArgument, match=r"model is required: this gateway serves \['a', 'b'\]"):
        several.route("")


@pytest.mark.parametrize(
    ("names", "match"),
    [
        ([("a", ()), ("a", ())], "'a' is served twice"),
        ([("a", ("x",)), ("b", ("x",))], "'x' is served twice"),
        ([("a", ("a",))], "'a' is served twice"),
        ([("a", ("b",)), ("b", ())], "'b' is served twice"),
        ([("", ())], "non-empty"),
        ([("a", ("",))], "non-empty"),
    ],
)
def test_duplicate_or_empty_names_are_configuration_errors(
    names: list[tuple[str, tuple[str, ...]]], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        EngineSet([engine(FakeBackend(), name, aliases) for name, aliases in names])


def test_no_engine_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no engine"):
        EngineSet([])


def test_model_info_gets_served_names_and_a_model_id() -> None:
    backend = FakeBackend(BackendSettings(model="/models/llama"), model=pb.ModelInfo(served_model_aliases=["stale"]))
    built = engine(backend, "llama", ["l"])
    assert built.model_info.model_id == "/models/llama"
    assert built.model_info.served_model_name == "llama"
    assert list(built.model_info.served_model_aliases) == ["l"]
    assert list(backend.facts.model.served_model_aliases) == ["stale"]  # the driver's table is not mutated
    assert built.names == ("llama", "l")
    assert built.role == pb.ENGINE_ROLE_AGGREGATED


def test_model_id_reported_by_the_driver_wins() -> None:
    built = engine(FakeBackend(BackendSettings(model=""), model=pb.ModelInfo(model_id="org/model")), "x")
    assert built.model_info.model_id == "org/model"
    assert engine(FakeBackend(BackendSettings(model="")), "served").model_info.model_id == "served"


def test_presence_is_kept_in_model_info() -> None:
    info = pb.ModelInfo(max_context_length=10, supports_lora=False)
    built = engine(FakeBackend(model=info))
    assert built.model_info.HasField("supports_lora") and not built.model_info.supports_lora
    assert not built.model_info.HasField("supports_multimodal")


def test_instance_id_is_filled_when_missing() -> None:
    assert engine(FakeBackend(instance_id="node-1")).facts.instance_id == "node-1"
    first, second = engine(FakeBackend()).facts.instance_id, engine(FakeBackend()).facts.instance_id
    assert first and second and first != second


def test_a_table_that_breaks_the_contract_fails_at_start() -> None:
    with pytest.raises(CapabilityError, match="max_context_length"):
        Engine("m", (), FakeBackend(), FakeBackend(model=pb.ModelInfo(max_context_length=0)).facts)
