"""One request means one thing on every engine: what a knob the request leaves unset samples with.

The rule (docs/backends/*.md): an unset knob takes the model's generation-config default (the keys
vLLM's ``get_diff_sampling_param`` reads), else the engines' neutral sampling, temperature 1, top-p 1
and top-k off. Each driver's mapping leaves to its engine what the engine's own default already says,
so the effective values are the mapping's output over the engine's ``SamplingParams`` defaults:
vLLM 0.32 ``vllm/sampling_params.py`` (temperature 1.0, top_p 1.0, top_k 0 = off), SGLang 0.5.23
``srt/sampling/sampling_params.py`` (1.0, 1.0, top_k -1 = off) and TensorRT-LLM 1.2.1
``tensorrt_llm/sampling_params.py`` (all None: ``TorchSampler`` then decodes greedily).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from openengine_backends.sglang import mapping as sglang
from openengine_backends.trtllm import mapping as trtllm
from openengine_backends.trtllm.sampling import TORCH_SAMPLER_KNOBS, sampling_defaults
from openengine_backends.vllm import mapping as vllm
from openengine_gateway.spi import GenerationRequest, Stopping

from .trtllm.test_mapping import FEATURES

GENERATION_CONFIG = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}

ENGINE_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "vllm": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
    "sglang": {"temperature": 1.0, "top_p": 1.0, "top_k": -1},
    "trtllm": {"temperature": 0.0, "top_p": None, "top_k": None},  # nothing set: greedy
}
OFF = (0, -1, None)


def request() -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=[5, 6, 7], stopping=Stopping(max_tokens=4))


def on_vllm(config: Mapping[str, Any]) -> dict[str, Any]:
    limits = vllm.EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, sampling_defaults=dict(config))
    return dict(vllm.plan_generation(request(), limits, prompt_len=3).sampling)


def on_sglang(config: Mapping[str, Any]) -> dict[str, Any]:
    limits = sglang.EngineLimits(max_context=100, max_prompt=94, vocab_size=128, sampling_defaults=dict(config))
    return dict(sglang.plan_generation(request(), limits, input_ids=[5, 6, 7]).outputs[0]["sampling_params"])


def on_trtllm(config: Mapping[str, Any]) -> dict[str, Any]:
    features = dataclasses.replace(FEATURES, sampling=sampling_defaults(dict(config), TORCH_SAMPLER_KNOBS))
    return dict(trtllm.plan_generation(request(), features, prompt_len=3).sampling)


DRIVERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "vllm": on_vllm,
    "sglang": on_sglang,
    "trtllm": on_trtllm,
}


def effective(engine: str, config: Mapping[str, Any]) -> tuple[float, float, int | None]:
    """(temperature, top_p, top_k or None for off) as the engine samples the request."""
    values = {**ENGINE_DEFAULTS[engine], **{k: v for k, v in DRIVERS[engine](config).items() if v is not None}}
    top_p = values["top_p"] if values["top_p"] is not None else 1.0
    top_k = None if values["top_k"] in OFF else int(values["top_k"])
    return float(values["temperature"]), float(top_p), top_k


@pytest.mark.parametrize(
    ("config", "expected"), [({}, (1.0, 1.0, None)), (GENERATION_CONFIG, (0.6, 0.9, 20))], ids=["none", "model"]
)
def test_a_request_without_sampling_knobs_samples_alike_on_every_engine(
    config: Mapping[str, Any], expected: tuple[float, float, int | None]
) -> None:
    assert {engine: effective(engine, config) for engine in DRIVERS} == dict.fromkeys(DRIVERS, expected)
