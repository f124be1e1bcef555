"""``VllmSettings`` takes vLLM engine arguments without importing vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest
from openengine_backends.vllm import VllmBackend, VllmSettings
from openengine_gateway.plugins import load_backend
from pydantic import ValidationError


def test_engine_arguments_are_kept_as_given() -> None:
    settings = VllmSettings(model="/m", max_model_len="512", engine_args={"enforce_eager": True})
    assert settings.engine_options == {"enforce_eager": True, "max_model_len": "512"}


def test_an_argument_given_twice_or_model_in_the_table_is_an_error() -> None:
    with pytest.raises(ValidationError, match="given twice"):
        VllmSettings(model="/m", dtype="float32", engine_args={"dtype": "float16"})
    with pytest.raises(ValidationError, match="top-level 'model'"):
        VllmSettings(engine_args={"model": "/m"})


def test_the_plugin_loads_by_name_without_importing_vllm() -> None:
    assert load_backend("vllm") is VllmBackend
    assert VllmBackend.Settings is VllmSettings and VllmBackend.name == "vllm"
    check = "import sys, openengine_backends.vllm.engine; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True)
