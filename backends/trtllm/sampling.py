"""What the engine's sampler applies, and the defaults of a request that leaves knobs unset: pure.

TensorRT-LLM 1.2's PyTorch backend samples with ``TorchSampler`` unless ``sampler_type`` is
``TRTLLMSampler`` (``_torch/pyexecutor/_util.py``; ``auto`` picks the latter for beam search
only, which this driver does not serve). ``TorchSampler`` reads temperature, top-k and top-p
alone (``_torch/pyexecutor/sampler.py``, ``_request_get_sampling_params``): ``SamplingParams``
takes penalties, ``min_p`` and a seed, and the sampler drops them, drawing from one generator
seeded 42 for every request. Speculative decoding samples with its own samplers, which apply no
more. What a sampler would silently ignore is refused: ``ModelInfo`` has no field to advertise
a sampling knob, so the refusal is the capability.

Defaults follow the project's rule for every engine: an unset knob takes the model's
generation-config default (the keys vLLM's ``get_diff_sampling_param`` reads), else the engines'
neutral sampling (temperature 1, top-p 1, top-k off). TensorRT-LLM would decode greedily when
none is set, so the driver always sets them. A generation-config default of a knob the sampler
cannot apply is dropped (the engine reports it once, at start), so it never refuses a request
that sets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openengine_gateway.spi import Sampling

TORCH_SAMPLER_KNOBS = frozenset({"temperature", "top_p", "top_k"})
"""What ``TorchSampler`` (and the speculative samplers) apply."""
TRTLLM_SAMPLER_KNOBS = TORCH_SAMPLER_KNOBS | {
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
}
"""What ``TRTLLMSampler`` (the C++ decoder's ``SamplingConfig``) applies besides."""

ENGINE_DEFAULTS: Mapping[str, Any] = {name: Sampling.NEUTRAL[name] for name in ("temperature", "top_p", "top_k")}
"""vLLM's and SGLang's sampling when neither request nor model says otherwise (top-k 0 is off)."""

GENERATION_CONFIG_KNOBS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The generation-config keys that are sampling defaults (vLLM's ``get_diff_sampling_param``)."""


def applied_knobs(sampler_type: Any, *, speculative: bool) -> frozenset[str]:
    """The knobs the engine's sampler applies, from ``sampler_type`` and a speculative config."""
    name = str(getattr(sampler_type, "value", sampler_type))
    if name == "TRTLLMSampler" and not speculative:
        return TRTLLM_SAMPLER_KNOBS
    return TORCH_SAMPLER_KNOBS


def refuse_unapplied(sampling: Sampling, applied: frozenset[str]) -> None:
    """``InvalidArgument`` for a knob set to a non-neutral value the sampler would ignore."""
    sampling.require_neutral(
        *sorted(TRTLLM_SAMPLER_KNOBS - applied),
        engine="this TensorRT-LLM engine's sampler (TorchSampler and the speculative samplers apply temperature, "
        "top_p and top_k only; an engine started with sampler_type TRTLLMSampler and no speculative_config "
        "applies the others)",
    )


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The defaults an unset knob takes, and the model's defaults the sampler cannot apply."""

    values: Mapping[str, Any]
    dropped: Mapping[str, Any]


NO_MODEL_DEFAULTS = SamplingDefaults(values=ENGINE_DEFAULTS, dropped={})
"""The defaults of a model without a generation config."""


def sampling_defaults(generation_config: Mapping[str, Any], applied: frozenset[str]) -> SamplingDefaults:
    """The engine's neutral sampling overridden by the model's generation-config defaults it applies.

    ``generation_config`` is the model's ``generation_config.json`` as a diff from Hugging Face's
    defaults (``GenerationConfig.to_diff_dict``), as vLLM reads it.
    """
    model = {name: value for name in GENERATION_CONFIG_KNOBS if (value := generation_config.get(name)) is not None}
    kept = {name: value for name, value in model.items() if name in applied}
    dropped = {
        name: value for name, value in model.items() if name not in applied and value != Sampling.NEUTRAL.get(name)
    }
    return SamplingDefaults(values={**ENGINE_DEFAULTS, **kept}, dropped=dropped)


__all__ = [
    "ENGINE_DEFAULTS",
    "GENERATION_CONFIG_KNOBS",
    "NO_MODEL_DEFAULTS",
    "TORCH_SAMPLER_KNOBS",
    "TRTLLM_SAMPLER_KNOBS",
    "SamplingDefaults",
    "applied_knobs",
    "refuse_unapplied",
    "sampling_defaults",
]
