"""The parameter classes of TensorRT-LLM's LLM API, as its sources define them, and ``install``.

``install`` fakes one release: 1.2.1 by default, or 1.3.0rc29 (``RELEASES``), where they differ.

Field names, defaults and the validation the driver relies on follow ``tensorrt_llm/sampling_params.py``
(``SamplingParams`` with ``n``/``best_of`` checked in ``__post_init__``, greedy decoding refusing
``best_of > 1``), ``disaggregated_params.py`` (1.2's fields only: ``ctx_dp_rank``,
``ctx_info_endpoint``, ``schedule_style`` and ``disagg_request_id`` came later and are a
``TypeError`` here), ``scheduling_params.py``, ``executor/request.py`` (``LoRARequest`` checking its
path) and ``llmapi/llm_args.py`` (``TorchLlmArgs``: a pydantic model that refuses unknown names and
coerces strings; ``disable_overlap_scheduler`` off and ``sampler_type`` ``auto`` by default).
``install`` puts them, with the fake ``LLM``, under TensorRT-LLM's module names for one test.
``DisaggregatedParams13`` follows the stored later ``disaggregated_params.py`` (commit 01009a3: the
four later ids and ``first_gen_log_probs``), read as 1.3's.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        if sum(bool(getattr(self, f.name)) for f in fields(self)) > 1:
            raise ValueError("Only one guide can be used for a request")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self) -> None:
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of is not None and self.best_of > 1 and self._greedy_decoding:
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns.")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        return not self.use_beam_search and (
            (self.temperature is None and self.top_p is None and self.top_k is None)
            or self.top_k == 1
            or self.top_p == 0.0
            or self.temperature == 0
        )

    def _setup(self, tokenizer: Any) -> SamplingParams:
        if self.end_id is None:
            if tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None")
            self.end_id = self.pad_id = tokenizer.eos_token_id
        return self


@dataclass(slots=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if self.lora_path is not None and not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")


@dataclass(slots=True, kw_only=True)
class DisaggregatedParams:
    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None
    multimodal_embedding_handles: list[dict[str, Any]] | None = None
    multimodal_hashes: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.request_type not in (None, "context_only", "generation_only", "context_and_generation"):
            raise ValueError(f"Unknown request type: {self.request_type}")


@dataclass(slots=True, kw_only=True)
class DisaggregatedParams13(DisaggregatedParams):
    first_gen_log_probs: list[Any] | None = None
    first_gen_logits: list[Any] | None = None
    disagg_request_id: int | None = None
    ctx_dp_rank: int | None = None
    ctx_info_endpoint: str | None = None
    schedule_style: int | None = None


@dataclass(frozen=True)
class Release:
    """Where the faked releases differ, each as the named upstream text says."""

    version: str
    disaggregated_params: type
    priority: bool
    """``generate_async`` takes a ``priority`` (the later ``llmapi/llm.py``, ``base_worker.py`` passing it on)."""
    worker_wraps_all: bool
    """``BaseWorker._enqueue_request`` wraps an adapter that fails to load in ``RequestError`` and
    raises for a prompt ``max_seq_len`` cannot hold (the later ``executor/base_worker.py`` text); 1.2.1's
    loads adapters before its ``try``, so the failure ends the worker (``executor/worker.py``,
    ``worker_main``: only ``RequestError`` becomes a response), and only warns in ``_deduce_max_tokens``."""
    overlap_refuses_context_only: bool
    """1.2.1's ``_enqueue_request`` raises a ``ValueError`` (outside its ``try``) for a context-only request
    under the overlap scheduler; the later text has no such check."""


RELEASES = {
    "1.2.1": Release(
        "1.2.1", DisaggregatedParams, priority=False, worker_wraps_all=False, overlap_refuses_context_only=True
    ),
    "1.3.0rc29": Release(
        "1.3.0rc29", DisaggregatedParams13, priority=True, worker_wraps_all=True, overlap_refuses_context_only=False
    ),
}


@dataclass(slots=True, kw_only=True)
class SchedulingParams:
    attention_dp_rank: int | None = None
    attention_dp_relax: bool = True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KvCacheConfig(_Strict):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    tokens_per_block: int = 32
    event_buffer_max_size: int = 0
    free_gpu_memory_fraction: float | None = None


class SchedulerConfig(_Strict):
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    waiting_queue_policy: Literal["fcfs", "priority"] = "fcfs"


class CacheTransceiverConfig(_Strict):
    backend: Literal["DEFAULT", "UCX", "NIXL", "MPI"] | None = None
    max_tokens_in_buffer: int | None = None


class TorchLlmArgs(_Strict):
    model: str
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    max_seq_len: int | None = None
    max_batch_size: int | None = 2048
    max_num_tokens: int | None = 8192
    max_beam_width: int = 1
    kv_cache_config: KvCacheConfig = KvCacheConfig()
    scheduler_config: SchedulerConfig = SchedulerConfig()
    cache_transceiver_config: CacheTransceiverConfig | None = None
    enable_chunked_prefill: bool = False
    disable_overlap_scheduler: bool = False
    sampler_type: Literal["TRTLLMSampler", "TorchSampler", "auto"] = "auto"
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    enable_iter_perf_stats: bool = False
    enable_lora: bool = False
    lora_config: dict[str, Any] | None = None
    enable_attention_dp: bool = False
    speculative_config: dict[str, Any] | None = None
    backend: str | None = None


@dataclass
class Installed:
    """The installed fake: its ``LLM`` class, the engines started, the context handoffs they share."""

    llm_class: type
    engines: list[Any] = field(default_factory=list)
    contexts: dict[int, Any] = field(default_factory=dict)


def install(
    monkeypatch: pytest.MonkeyPatch, *, priority: bool = False, version: str = "1.2.1", versioned: str | None = None
) -> Installed:
    """Make ``import tensorrt_llm`` (and the submodules the driver imports) find the fake of release ``version``
    (``versioned`` overrides only the version string it reports, for a release the driver refuses)."""
    from . import fake_llm

    release = RELEASES[version]
    llm_class = fake_llm.PriorityLLM if priority or release.priority else fake_llm.LLM
    monkeypatch.setattr(fake_llm, "RELEASE", release)
    fake_llm.CONTEXTS.clear()
    fake_llm.ENGINES.clear()
    installed = Installed(llm_class, fake_llm.ENGINES, fake_llm.CONTEXTS)
    sampling_module = _module("tensorrt_llm.sampling_params", SamplingParams=SamplingParams)
    sampling_module.GuidedDecodingParams = GuidedDecodingParams  # type: ignore[attr-defined]
    modules = {
        "tensorrt_llm": _module(
            "tensorrt_llm",
            __version__=versioned or release.version,
            LLM=llm_class,
            SamplingParams=SamplingParams,
            sampling_params=sampling_module,
        ),
        "tensorrt_llm.sampling_params": sampling_module,
        "tensorrt_llm.disaggregated_params": _module(
            "tensorrt_llm.disaggregated_params", DisaggregatedParams=release.disaggregated_params
        ),
        "tensorrt_llm.executor.result": _module("tensorrt_llm.executor.result", Logprob=fake_llm.Logprob),
        "tensorrt_llm.executor": _module("tensorrt_llm.executor", LoRARequest=LoRARequest),
        "tensorrt_llm.executor.request": _module("tensorrt_llm.executor.request", LoRARequest=LoRARequest),
        "tensorrt_llm.llmapi": _module("tensorrt_llm.llmapi", LLM=llm_class, TorchLlmArgs=TorchLlmArgs),
        "tensorrt_llm.scheduling_params": _module("tensorrt_llm.scheduling_params", SchedulingParams=SchedulingParams),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return installed


def _module(name: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for member, value in members.items():
        setattr(module, member, value)
    return module


__all__ = [
    "RELEASES",
    "CacheTransceiverConfig",
    "DisaggregatedParams",
    "DisaggregatedParams13",
    "GuidedDecodingParams",
    "Installed",
    "KvCacheConfig",
    "LoRARequest",
    "Release",
    "SamplingParams",
    "SchedulerConfig",
    "SchedulingParams",
    "TorchLlmArgs",
    "install",
]
