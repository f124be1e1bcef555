"""``TrtllmSettings`` and ``llm_args`` take TensorRT-LLM's ``LLM`` arguments without importing it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from openengine_backends.trtllm import TrtllmBackend, TrtllmSettings
from openengine_backends.trtllm.llm_args import cli_value, llm_kwargs
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.plugins import load_backend
from pydantic import ValidationError

KNOWN = {"max_seq_len", "kv_cache_config", "enable_iter_perf_stats", "backend", "cache_transceiver_config"}


def test_arguments_are_kept_as_given_and_the_role_is_the_drivers() -> None:
    settings = TrtllmSettings(model="/m", role="prefill", max_seq_len="512", llm_args={"kv_cache_config": {}})
    assert settings.llm_options == {"kv_cache_config": {}, "max_seq_len": "512"}
    assert settings.role == "prefill"
    with pytest.raises(ValidationError):
        TrtllmSettings(model="/m", role="both")


def test_an_argument_given_twice_or_model_in_the_table_is_an_error() -> None:
    with pytest.raises(ValidationError, match="given twice"):
        TrtllmSettings(model="/m", max_seq_len=8, llm_args={"max_seq_len": 9})
    with pytest.raises(ValidationError, match="top-level 'model'"):
        TrtllmSettings(llm_args={"model": "/m"})


def test_json_text_from_the_command_line_becomes_a_nested_config() -> None:
    assert cli_value('{"tokens_per_block": 32}') == {"tokens_per_block": 32}
    assert cli_value("512") == "512" and cli_value(7) == 7
    with pytest.raises(ConfigurationError, match="does not parse"):
        cli_value("{tokens_per_block: 32}")


def test_llm_kwargs_turn_statistics_on_and_name_unknown_arguments() -> None:
    assert llm_kwargs({"max_seq_len": "512"}, KNOWN, role="aggregated") == {
        "enable_iter_perf_stats": True,
        "max_seq_len": "512",
    }
    assert llm_kwargs({"enable_iter_perf_stats": False}, KNOWN, role="aggregated") == {"enable_iter_perf_stats": False}
    with pytest.raises(ConfigurationError, match="unknown LLM arguments: max_model_len"):
        llm_kwargs({"max_model_len": 512}, KNOWN, role="aggregated")


def test_only_the_pytorch_backend_and_disaggregation_with_a_transceiver() -> None:
    with pytest.raises(ConfigurationError, match="PyTorch backend"):
        llm_kwargs({"backend": "_autodeploy"}, KNOWN, role="aggregated")
    with pytest.raises(ConfigurationError, match="prefill engine needs cache_transceiver_config"):
        llm_kwargs({}, KNOWN, role="prefill")
    kwargs = llm_kwargs({"cache_transceiver_config": '{"backend": "UCX"}'}, KNOWN, role="decode")
    assert kwargs["cache_transceiver_config"] == {"backend": "UCX"}


def test_the_plugin_loads_by_name_without_importing_tensorrt_llm() -> None:
    assert load_backend("trtllm") is TrtllmBackend
    assert TrtllmBackend.Settings is TrtllmSettings and TrtllmBackend.name == "trtllm"
    check = "import sys, openengine_backends.trtllm.engine; assert 'tensorrt_llm' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True)
