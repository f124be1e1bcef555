"""``SglangSettings`` and SGLang's server arguments, without SGLang."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest
from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_backends.sglang.server_args import parse_strings, server_kwargs
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.plugins import load_backend
from pydantic import ValidationError

from .fake_api import ServerArgs


def test_server_arguments_are_kept_as_given() -> None:
    settings = SglangSettings(model="/m", context_length="512", enable_lora=True)
    assert settings.server_options == {"context_length": "512", "enable_lora": True}
    with pytest.raises(ValidationError, match="model_path"):
        SglangSettings(model_path="/m")


def test_the_plugin_loads_by_name_without_importing_sglang() -> None:
    assert load_backend("sglang") is SglangBackend
    assert SglangBackend.Settings is SglangSettings and SglangBackend.name == "sglang"
    check = "import sys, openengine_backends.sglang.engine; assert 'sglang' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True)


def test_command_line_strings_go_through_sglangs_parser(fake: types.ModuleType) -> None:
    options = {"context_length": "512", "enable_lora": "true", "dp_size": 2, "grammar_backend": "outlines"}
    kwargs = server_kwargs("/models/fake-llm", options)
    assert kwargs == {
        "context_length": 512,
        "enable_lora": True,
        "dp_size": 2,
        "grammar_backend": "outlines",
        "model_path": "/models/fake-llm",
    }


def test_unknown_names_and_bad_values_are_named(fake: types.ModuleType) -> None:
    with pytest.raises(ConfigurationError, match="unknown server arguments: max_model_len"):
        server_kwargs("/m", {"max_model_len": "5"})
    with pytest.raises(ConfigurationError, match="takes true or false"):
        server_kwargs("/m", {"enable_lora": "maybe"})
    with pytest.raises(ConfigurationError, match="invalid server argument"):
        server_kwargs("/m", {"grammar_backend": "regexes"})
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    with pytest.raises(ConfigurationError, match="invalid server argument"):
        parse_strings(parser, "/m", {"context_length": "many"})
