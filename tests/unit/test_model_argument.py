"""A model that is a path must exist, said before any engine loads; a hub id is left to the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway import launch
from openengine_gateway.config import Config, EngineSection, looks_like_path
from openengine_gateway.errors import ConfigurationError


@pytest.mark.parametrize(
    "model", ["/models/llama", "~/llama", "./llama", "../llama", ".models/tiny-llama", "models/llama/7b", "."]
)
def test_what_can_only_be_a_path(model: str) -> None:
    assert looks_like_path(model)


@pytest.mark.parametrize("model", ["gpt2", "meta-llama/Llama-3.2-1B", "mock-model", "tiny-llama", ""])
def test_what_may_be_a_hub_id(model: str) -> None:
    assert not looks_like_path(model)


@pytest.mark.parametrize(("model", "where"), [("./nope", " (relative to "), ("/nope/model", "")])
def test_a_missing_model_path_is_a_usage_error_naming_it(model: str, where: str) -> None:
    section = EngineSection(backend="mock", options={"model": model})
    with pytest.raises(ConfigurationError, match=f"--backend mock: model path '{model}' does not exist") as error:
        launch.plan_engines([section], Config(), command_line=True)
    assert where in str(error.value)


def test_an_existing_path_and_a_hub_id_pass(tmp_path: Path) -> None:
    sections = [
        EngineSection(backend="mock", served_model_name="a", options={"model": str(tmp_path)}),
        EngineSection(backend="mock", served_model_name="b", options={"model": "org/model"}),
    ]
    assert [plan.served_name for plan in launch.plan_engines(sections, Config())] == ["a", "b"]
