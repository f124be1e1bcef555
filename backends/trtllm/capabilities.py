"""A started TensorRT-LLM engine's facts → what the driver advertises and reports: pure.

``EngineFeatures`` holds what ``engine.py`` read off the started ``LLM`` (its resolved
arguments, the first iteration statistics, the signature of ``generate_async``, the fields of
its ``DisaggregatedParams``, the model's generation config). ``ModelInfo`` built from it is both
what discovery returns and what the gateway enforces, so a feature is advertised only when the
started engine honours it: guidance only with a grammar backend (without one TensorRT-LLM drops
the guide silently), priority only when ``generate_async`` takes one and the scheduler orders
by it, candidates only as top-N (all TensorRT-LLM returns), LoRA only with a ``lora_config``
(without one its worker ignores a ``lora_request`` and serves the base model). Prompt logprobs
are reported unsupported: TensorRT-LLM returns each prompt position's top-k, not the prompt
token's own logprob, which every ``PromptOutput`` record must carry. Sampling knobs have no
``ModelInfo`` field: those the sampler ignores are refused by ``mapping`` (``sampling``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from openengine_gateway import pb
from openengine_gateway.spi import Load

from .sampling import NO_MODEL_DEFAULTS, TORCH_SAMPLER_KNOBS, SamplingDefaults, applied_knobs, sampling_defaults

ENGINE_NAME = "tensorrt_llm"

DEFAULT_MAX_TOP_LOGPROBS = 20
"""TensorRT-LLM's cap on top logprobs where the installed release does not export one
(``sampling_params.MAX_TOP_LOGPROBS``, 20 when it was introduced)."""

_ALL_BUT_TAGS = (
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA,
    pb.GUIDED_DECODING_MODE_REGEX,
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR,
    pb.GUIDED_DECODING_MODE_CHOICE,
    pb.GUIDED_DECODING_MODE_JSON_OBJECT,
)
GUIDED_MODES_BY_BACKEND: Mapping[str, tuple[pb.GuidedDecodingMode.ValueType, ...]] = {
    "xgrammar": (*_ALL_BUT_TAGS, pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG),
    # llguidance has no structural-tag matcher; choice is served as a regex by both.
    "llguidance": _ALL_BUT_TAGS,
}

HANDOFF_FIELDS_1_2 = frozenset({"request_type", "first_gen_tokens", "ctx_request_id", "opaque_state", "draft_tokens"})
"""The handoff fields of TensorRT-LLM 1.2's ``DisaggregatedParams`` (later releases add more)."""

ROLES: Mapping[str, pb.EngineRole.ValueType] = {
    "aggregated": pb.ENGINE_ROLE_AGGREGATED,
    "prefill": pb.ENGINE_ROLE_PREFILL,
    "decode": pb.ENGINE_ROLE_DECODE,
}


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """What a started engine is and honours; ``None`` where it cannot say."""

    max_seq_len: int | None = None
    """The executor's resolved ``max_seq_len`` (``resolved_max_seq_len``: not ``args.max_seq_len``)."""
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    chunked_prefill: bool = False
    tokens_per_block: int | None = None
    total_kv_blocks: int | None = None
    """KV blocks of one rank's primary pool (the first iteration statistics' ``maxNumBlocks``)."""
    has_tokenizer: bool = True
    lora: bool = False
    guided_backend: str | None = None
    priority: bool = False
    cache_salt: bool = False
    max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS
    sampled_logprob_only: bool = False
    """Whether the sampler's logprob row is the sampled token's alone (the speculative samplers), not the top-k."""
    eos_token_ids: tuple[int, ...] = ()
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    attention_dp: bool = False
    role: pb.EngineRole.ValueType = pb.ENGINE_ROLE_AGGREGATED
    transfer_backend: str = ""
    kv_events: bool = False
    sampler_knobs: frozenset[str] = TORCH_SAMPLER_KNOBS
    """The sampling knobs (and ``seed``) the engine's sampler applies."""
    sampling: SamplingDefaults = NO_MODEL_DEFAULTS
    """What an unset knob takes, and the model's defaults the sampler cannot apply."""
    handoff_fields: frozenset[str] = HANDOFF_FIELDS_1_2
    """The fields the installed ``DisaggregatedParams`` takes."""

    def max_context(self, *, generation_only: bool = False) -> int | None:
        """The longest context (prompt and output) a request takes.

        Without chunked prefill ``LLM._check_arguments`` (``llmapi/llm.py``, the 1.2-era text)
        refuses a prompt longer than ``max_num_tokens``, except a generation-only request's (a
        handoff to a decode engine): a prompt of ``max_num_tokens`` tokens and one output token is
        then the longest context, so a prompt is refused here exactly where TensorRT-LLM would.
        """
        prompt_bound = None
        if self.max_num_tokens and not self.chunked_prefill and not generation_only:
            prompt_bound = self.max_num_tokens + 1
        known = [value for value in (self.max_seq_len, prompt_bound) if value]
        return min(known) if known else None

    @property
    def data_parallel_size(self) -> int:
        """Attention data parallelism runs one attention rank per tensor-parallel rank."""
        return self.tensor_parallel_size if self.attention_dp else 1


def eos_ids(llm: Any) -> tuple[int, ...]:
    """The id TensorRT-LLM ends on (``end_id``): the tokenizer's EOS, else the model config's."""
    eos = getattr(llm.tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(llm, "_hf_model_config", None), "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) and eos else eos
    return (int(eos),) if isinstance(eos, int) else ()


def engine_features(
    llm: Any,
    *,
    stats: Mapping[str, Any] | None,
    role: str,
    max_top_logprobs: int,
    handoff_fields: frozenset[str],
    generation_config: Mapping[str, Any],
) -> EngineFeatures:
    """A started ``LLM``'s facts, from its resolved arguments, first statistics and signature.

    Read duck-typed by TensorRT-LLM's names. ``handoff_fields`` are the installed
    ``DisaggregatedParams``'s fields; ``generation_config`` is the model's (``generation_config``).
    """
    args = llm.args
    kv_config = getattr(args, "kv_cache_config", None)
    kv_stats = (stats or {}).get("kvCacheStats") or {}
    accepted = inspect.signature(llm.generate_async).parameters
    policy = str(getattr(getattr(args, "scheduler_config", None), "waiting_queue_policy", "") or "").lower()
    transceiver = getattr(args, "cache_transceiver_config", None)
    tokens_per_block = kv_stats.get("tokensPerBlock") or getattr(kv_config, "tokens_per_block", None)
    speculative = getattr(args, "speculative_config", None) is not None
    knobs = applied_knobs(getattr(args, "sampler_type", None), speculative=speculative)
    return EngineFeatures(
        max_seq_len=resolved_max_seq_len(llm, kv_stats.get("maxNumBlocks"), tokens_per_block),
        max_batch_size=args.max_batch_size,
        max_num_tokens=args.max_num_tokens,
        chunked_prefill=bool(getattr(args, "enable_chunked_prefill", False)),
        tokens_per_block=tokens_per_block,
        total_kv_blocks=kv_stats.get("maxNumBlocks"),
        has_tokenizer=llm.tokenizer is not None,
        lora=getattr(args, "lora_config", None) is not None,
        guided_backend=args.guided_decoding_backend,
        priority="priority" in accepted and "priority" in policy,
        cache_salt="cache_salt" in accepted,
        # Its speculative samplers return only the sampled token's logprob (``validate_request``).
        max_top_logprobs=1 if speculative else max_top_logprobs,
        sampled_logprob_only=speculative,
        eos_token_ids=eos_ids(llm),
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        attention_dp=bool(args.enable_attention_dp),
        role=ROLES[role],
        transfer_backend=str(getattr(transceiver, "backend", "") or "").lower(),
        # TensorRT-LLM records KV events only with a buffer and block reuse both on (``LLM.get_kv_cache_events``).
        kv_events=(getattr(kv_config, "event_buffer_max_size", 0) or 0) > 0
        and bool(getattr(kv_config, "enable_block_reuse", True)),
        sampler_knobs=knobs,
        sampling=sampling_defaults(generation_config, knobs),
        handoff_fields=handoff_fields,
    )


def resolved_max_seq_len(llm: Any, total_blocks: int | None, tokens_per_block: int | None) -> int | None:
    """The longest sequence the executor takes, which ``llm.args.max_seq_len`` does not say.

    ``args.max_seq_len`` stays None unless given; the executor then takes the model's
    ``max_position_embeddings``, and its KV cache manager cuts either to what the KV pool holds
    (``_torch/pyexecutor/_util.py``). The resolved value stays in the executor's process, so it
    is computed the same way here from the pool the first statistics report. A prompt is also
    bounded by ``max_num_tokens`` (``EngineFeatures.max_context``).
    """
    hf_config = getattr(llm, "_hf_model_config", None)
    configured: int | None = llm.args.max_seq_len or getattr(hf_config, "max_position_embeddings", None)
    pool = total_blocks * tokens_per_block if total_blocks and tokens_per_block else None
    known = [value for value in (configured, pool) if value]
    return min(known) if known else None


def guided_capabilities(backend: str | None) -> pb.GuidedDecodingCapabilities:
    """The guide kinds the engine's grammar backend builds; none without a backend."""
    modes = GUIDED_MODES_BY_BACKEND.get(backend or "", ())
    return pb.GuidedDecodingCapabilities(supported=bool(modes), modes=modes)


def logprob_capabilities(max_top_n: int) -> pb.LogprobCapabilities:
    """Top-N candidates up to TensorRT-LLM's cap: it returns neither chosen ids nor whole vocabularies."""
    return pb.LogprobCapabilities(
        supported=True, candidate_selection_modes=[pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N], max_top_n=max_top_n
    )


def model_info(features: EngineFeatures, model_id: str) -> pb.ModelInfo:
    """The advertised capabilities of the model a started engine serves."""
    info = pb.ModelInfo(
        model_id=model_id,
        supports_text_input=features.has_tokenizer,
        supports_token_ids_input=True,
        supports_lora=features.lora,
        supports_multimodal=False,
    )
    for field, value in (
        # A decode engine's requests are handoffs, which TensorRT-LLM takes past max_num_tokens.
        ("max_context_length", features.max_context(generation_only=features.role == pb.ENGINE_ROLE_DECODE)),
        ("max_running_requests", features.max_batch_size),
        ("max_batched_tokens", features.max_num_tokens),
        ("kv_block_size", features.tokens_per_block),
        ("total_kv_blocks", features.total_kv_blocks),
    ):
        if value:
            setattr(info, field, value)
    info.generation.CopyFrom(
        pb.GenerationCapabilities(
            prompt_logprobs=pb.LogprobCapabilities(supported=False),
            output_logprobs=logprob_capabilities(features.max_top_logprobs),
            guided_decoding=guided_capabilities(features.guided_backend),
            supports_priority=features.priority,
            supports_stop_in_output=True,
            supports_cache_salt=features.cache_salt,
            supports_prefix_cache_bypass=False,
        )
    )
    # One output a request: TensorRT-LLM sets an output's finish_reason only once the whole request is
    # final (result.py, under ``if self._done``), so an output that ends before the others would never
    # be finished truthfully. Several outputs are several requests.
    info.generation.max_num_sequences = 1
    for task in (info.tasks.embed, info.tasks.classify, info.tasks.score):
        task.supported = False
    return info


def parallelism(features: EngineFeatures) -> pb.ParallelismInfo:
    """Tensor and pipeline sizes; attention data-parallel ranks as the data-parallel size."""
    return pb.ParallelismInfo(
        tensor_parallel_size=features.tensor_parallel_size,
        pipeline_parallel_size=features.pipeline_parallel_size,
        data_parallel_size=features.data_parallel_size,
        data_parallel_rank=0,
        data_parallel_start_rank=0,
    )


def kv_connector(features: EngineFeatures) -> pb.KvConnectorInfo | None:
    """The cache transceiver of a prefill or decode engine (None when aggregated)."""
    if features.role == pb.ENGINE_ROLE_AGGREGATED:
        return None
    decode = features.role == pb.ENGINE_ROLE_DECODE
    return pb.KvConnectorInfo(
        enabled=True,
        transfer_backend=features.transfer_backend,
        supports_remote_prefill=decode,
        # The decode side resumes from the prefill's handoff (``opaque_state`` or ``ctx_info_endpoint``), not a
        # separate pull channel: TensorRT-LLM's own servicer advertises false too (``grpc/openengine/servicer.py``).
        supports_decode_pull=False,
        # TensorRT-LLM's executor keeps a handed-off KV cache until the decode side pulls it or its transfer
        # times out, and offers no call that releases it (aborting the context request cancels the transfer).
        supports_abort_cleanup=False,
    )


def load_info(
    stats: Mapping[str, Any] | None,
    *,
    in_flight: int,
    total_blocks: int | None,
    timestamp_ns: int,
    kv_outlives_requests: bool = False,
) -> Load:
    """A load snapshot from TensorRT-LLM's latest iteration statistics (camelCase JSON).

    TensorRT-LLM reports statistics only for iterations it runs, so the last ones go stale
    when it idles: with no request in flight (every request reaches the engine through this
    driver), running and queued are zero, as measured facts, and so are the used blocks unless
    ``kv_outlives_requests`` (a prefill engine, whose executor holds a handed-off KV cache after
    its request ended: then they are unknown); a request submitted since the last statistics
    counts as running at least. ``timestamp_ns`` is when the statistics arrived (or now, when idle).
    """
    known = Load(timestamp_unix_nanos=timestamp_ns, total_kv_blocks=total_blocks or None)
    if in_flight == 0:
        used = 0 if total_blocks and not kv_outlives_requests else None
        return replace(
            known, running_requests=0, queued_requests=0, prefill_batch_size=0, decode_batch_size=0, used_kv_blocks=used
        )
    if stats is None:
        return known
    batching = stats.get("inflightBatchingStats") or {}
    kv = stats.get("kvCacheStats") or {}
    queued = int(stats.get("numQueuedRequests", 0)) + int(batching.get("numPausedRequests", 0))
    return replace(
        known,
        queued_requests=queued,
        # Statistics trail the requests submitted since: each of those is queued or running.
        running_requests=max(int(stats.get("numActiveRequests", 0)), in_flight - queued),
        prefill_batch_size=int(batching.get("numContextRequests", 0)),
        decode_batch_size=int(batching.get("numGenRequests", 0)),
        used_kv_blocks=int(kv["usedNumBlocks"]) if "usedNumBlocks" in kv else None,
        total_kv_blocks=int(kv["maxNumBlocks"]) if kv.get("maxNumBlocks") else known.total_kv_blocks,
    )


__all__ = [
    "DEFAULT_MAX_TOP_LOGPROBS",
    "ENGINE_NAME",
    "GUIDED_MODES_BY_BACKEND",
    "HANDOFF_FIELDS_1_2",
    "ROLES",
    "EngineFeatures",
    "engine_features",
    "eos_ids",
    "guided_capabilities",
    "kv_connector",
    "load_info",
    "logprob_capabilities",
    "model_info",
    "parallelism",
    "resolved_max_seq_len",
]
