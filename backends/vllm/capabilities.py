"""A started vLLM engine's resolved config → what the driver advertises: pure, no vLLM import.

``ModelInfo`` is both what discovery returns and what the gateway enforces, so every entry is
derived from the *started* engine (after vLLM resolved the block size, the KV blocks it could
allocate, the scheduler limits and the platform's features), never from the requested
arguments. The config objects are read duck-typed, by vLLM's attribute names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openengine_gateway import pb
from openengine_gateway.spi import KvEventSource, Load, RankLoad
from openengine_gateway.spi.zmq_kv import zmq_source

ENGINE_NAME = "vllm"

ALL_GUIDED_MODES = (
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA,
    pb.GUIDED_DECODING_MODE_REGEX,
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR,
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG,
    pb.GUIDED_DECODING_MODE_CHOICE,
    pb.GUIDED_DECODING_MODE_JSON_OBJECT,
)
_REGULAR_MODES = (pb.GUIDED_DECODING_MODE_JSON_SCHEMA, pb.GUIDED_DECODING_MODE_REGEX, pb.GUIDED_DECODING_MODE_CHOICE)
GUIDED_MODES_BY_BACKEND: Mapping[str, tuple[pb.GuidedDecodingMode.ValueType, ...]] = {
    "auto": ALL_GUIDED_MODES,
    "xgrammar": ALL_GUIDED_MODES,
    "guidance": ALL_GUIDED_MODES,
    # vLLM's outlines and lm-format-enforcer backends reject grammars, structural tags and JSON objects.
    "outlines": _REGULAR_MODES,
    "lm-format-enforcer": _REGULAR_MODES,
}

_ROLES = {"kv_producer": pb.ENGINE_ROLE_PREFILL, "kv_consumer": pb.ENGINE_ROLE_DECODE}


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """Facts about a started engine that its config objects do not hold."""

    supported_tasks: tuple[str, ...]
    vocab_size: int
    has_tokenizer: bool
    structured_outputs: bool
    """The platform supports structured outputs (``Platform.supports_structured_output``)."""
    token_id_logprobs: bool
    """Explicit candidate ids are scored right (model runner V2). Runner V1 scores no prompt ones,
    and its sampler answers every request of a batch with the explicit-id rows once one request
    asks for them, so a top-N request batched with it gets the sampled token and -inf padding."""
    max_num_sequences: int
    """``VLLM_MAX_N_SEQUENCES``."""
    engines: int = 1
    """Engine cores (data-parallel ranks) this frontend drives."""
    lora_prompt_logprobs: bool = True
    """The platform's LoRA logits kernels cover prompt positions. vLLM's CPU kernels map only the
    sampled rows: prompt logprobs in a batch then fail an einsum in the worker and kill the engine core."""


def resolved_max_logprobs(max_logprobs: int, vocab_size: int) -> int:
    """vLLM's ``max_logprobs`` with -1 (no limit) resolved to the vocabulary size."""
    return vocab_size if max_logprobs == -1 else max_logprobs


def logprob_capabilities(max_logprobs: int, vocab_size: int, *, token_ids: bool) -> pb.LogprobCapabilities:
    """Candidate modes within ``max_logprobs``: top N, explicit ids, and all when the cap allows."""
    limit = resolved_max_logprobs(max_logprobs, vocab_size)
    caps = pb.LogprobCapabilities(supported=True)
    if limit > 0:
        caps.candidate_selection_modes.append(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N)
        caps.max_top_n = limit
    if token_ids:
        caps.candidate_selection_modes.append(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS)
    if limit >= vocab_size:
        caps.candidate_selection_modes.append(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL)
    return caps


def guided_capabilities(backend: str | None) -> pb.GuidedDecodingCapabilities:
    """The guide kinds the engine's structured-outputs backend compiles (none without one)."""
    if backend is None:
        return pb.GuidedDecodingCapabilities(supported=False)
    return pb.GuidedDecodingCapabilities(supported=True, modes=GUIDED_MODES_BY_BACKEND.get(backend, ()))


def guided_backend(config: Any, features: EngineFeatures) -> str | None:
    """The engine's structured-outputs backend, or None when the engine cannot guide."""
    if not (features.structured_outputs and features.has_tokenizer and "generate" in features.supported_tasks):
        return None
    backend: str = config.structured_outputs_config.backend
    return backend


def blocks_per_rank(config: Any, features: EngineFeatures) -> int | None:
    """KV blocks one data-parallel rank holds (vLLM sums ``num_gpu_blocks`` over the ranks it drives)."""
    total = config.cache_config.num_gpu_blocks
    return None if not total else total // max(features.engines, 1)


def model_info(config: Any, features: EngineFeatures) -> pb.ModelInfo:
    """The advertised capabilities of the model a started engine serves."""
    model, cache, scheduler = config.model_config, config.cache_config, config.scheduler_config
    generates = "generate" in features.supported_tasks
    info = pb.ModelInfo(
        model_id=model.model,
        max_context_length=model.max_model_len,
        max_running_requests=scheduler.max_num_seqs,
        max_batched_tokens=scheduler.max_num_batched_tokens,
        supports_text_input=features.has_tokenizer,
        supports_token_ids_input=True,
        supports_lora=config.lora_config is not None,
        supports_multimodal=bool(model.is_multimodal_model) and generates,
    )
    if cache.block_size:
        info.kv_block_size = cache.block_size
    blocks = blocks_per_rank(config, features)
    if blocks:
        info.total_kv_blocks = blocks
    if model.tokenizer_mode:
        info.tokenizer_modes.append(model.tokenizer_mode)
    if generates:
        info.generation.CopyFrom(generation_capabilities(config, features))
    return info


def generation_capabilities(config: Any, features: EngineFeatures) -> pb.GenerationCapabilities:
    """Sampling, logprob, guided-decoding and scheduling options the engine honours."""
    max_logprobs = config.model_config.max_logprobs
    if config.lora_config is not None and not features.lora_prompt_logprobs:
        prompt_logprobs = pb.LogprobCapabilities(supported=False)
    else:
        prompt_logprobs = logprob_capabilities(max_logprobs, features.vocab_size, token_ids=features.token_id_logprobs)
    return pb.GenerationCapabilities(
        prompt_logprobs=prompt_logprobs,
        output_logprobs=logprob_capabilities(max_logprobs, features.vocab_size, token_ids=features.token_id_logprobs),
        guided_decoding=guided_capabilities(guided_backend(config, features)),
        max_num_sequences=features.max_num_sequences,
        supports_priority=config.scheduler_config.policy == "priority",
        supports_stop_in_output=True,
        supports_cache_salt=True,
        supports_prefix_cache_bypass=True,
    )


def engine_role(config: Any) -> pb.EngineRole.ValueType:
    """PREFILL for a KV producer, DECODE for a KV consumer, else AGGREGATED (``kv_both`` too)."""
    transfer = config.kv_transfer_config
    if transfer is None or transfer.kv_connector is None:
        return pb.ENGINE_ROLE_AGGREGATED
    return _ROLES.get(transfer.kv_role, pb.ENGINE_ROLE_AGGREGATED)


def parallelism(config: Any) -> pb.ParallelismInfo:
    """Tensor, pipeline and data parallel sizes, and this frontend's first data-parallel rank."""
    parallel = config.parallel_config
    return pb.ParallelismInfo(
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        data_parallel_size=parallel.data_parallel_size,
        data_parallel_rank=parallel.data_parallel_rank,
        data_parallel_start_rank=parallel.data_parallel_rank,
    )


def kv_connector(config: Any) -> pb.KvConnectorInfo | None:
    """The KV-transfer connector, when the engine was started with one."""
    transfer = config.kv_transfer_config
    if transfer is None or transfer.kv_connector is None:
        return None
    role = engine_role(config)
    return pb.KvConnectorInfo(
        enabled=True,
        transfer_backend=transfer.kv_connector,
        supports_remote_prefill=role == pb.ENGINE_ROLE_DECODE,
        supports_decode_pull=role == pb.ENGINE_ROLE_DECODE,
        # A finished prefill's KV stays with the connector until its decode pulls it or vLLM's
        # own timeout passes: vLLM has no call that releases it on Abort.
        supports_abort_cleanup=False,
    )


def load_info(stats: Mapping[int, Any], *, blocks: int | None, ranks: Sequence[int]) -> Load:
    """A load snapshot from vLLM's latest ``SchedulerStats`` per engine (data-parallel rank).

    A rank without stats yet has not scheduled anything: it reports zero load. Used blocks are
    vLLM's KV usage fraction times the rank's blocks, rounded; unknown without a block count.
    """
    entries = []
    for rank in ranks:
        scheduler = stats.get(rank)
        running = scheduler.num_running_reqs if scheduler is not None else 0
        waiting = scheduler.num_waiting_reqs + scheduler.num_skipped_waiting_reqs if scheduler is not None else 0
        used = (round(scheduler.kv_cache_usage * blocks) if scheduler is not None else 0) if blocks else None
        entries.append(
            RankLoad(rank, running, waiting, used_kv_blocks=used, total_kv_blocks=blocks if blocks else None)
        )
    return Load(
        running_requests=sum(entry.running_requests or 0 for entry in entries),
        queued_requests=sum(entry.queued_requests or 0 for entry in entries),
        used_kv_blocks=sum(entry.used_kv_blocks or 0 for entry in entries) if blocks else None,
        total_kv_blocks=blocks * len(entries) if blocks else None,
        ranks=entries,
    )


def publisher_binds(endpoint: str) -> bool:
    """Whether vLLM's ``ZmqEventPublisher`` binds ``endpoint`` (its rule: a wildcard, ipc or
    inproc) rather than connecting out to a subscriber of the operator's own, which then holds
    the address: there is nothing there for the gateway to subscribe to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def subscribable(config: Any, sources: Mapping[int, Any]) -> Mapping[int, Any]:
    """The publishers this process can subscribe to: ones vLLM binds, outside its own process.

    vLLM decides on the configured endpoint (``kv_events_config``), not on the resolved one in
    ``sources``, where a bound ``tcp://*:0`` reads as this node's address.
    """
    configured = getattr(getattr(config, "kv_events_config", None), "endpoint", None) or ""
    if not publisher_binds(configured) or configured.startswith("inproc://"):
        return {}
    return sources


def kv_event_sources(sources: Mapping[int, Any]) -> list[KvEventSource]:
    """Subscribable publishers (``subscribable``) per data-parallel rank, endpoints as vLLM
    resolved them, that another host can reach (``zmq_source``)."""
    result = []
    for rank, events in sorted(sources.items()):
        source = zmq_source(
            rank,
            events.endpoint,
            events.topic,
            replay_endpoint=events.replay_endpoint or "",
            buffer_steps=events.buffer_steps,
            hwm=events.hwm,
            max_queue_size=events.max_queue_size,
        )
        if source is not None:
            result.append(source)
    return result


__all__ = [
    "ALL_GUIDED_MODES",
    "ENGINE_NAME",
    "GUIDED_MODES_BY_BACKEND",
    "EngineFeatures",
    "blocks_per_rank",
    "engine_role",
    "generation_capabilities",
    "guided_backend",
    "guided_capabilities",
    "kv_connector",
    "kv_event_sources",
    "load_info",
    "logprob_capabilities",
    "model_info",
    "parallelism",
    "publisher_binds",
    "resolved_max_logprobs",
    "subscribable",
]
