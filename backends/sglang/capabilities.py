"""A started SGLang engine's resolved configuration → what the driver advertises: pure, no SGLang import.

``ModelInfo`` is both what discovery returns and what the gateway enforces, so every entry comes
from the *started* engine: the resolved server arguments and the scheduler's state as SGLang's
``get_internal_state`` reports them (page size, KV token capacity, effective running-request
limit, disaggregation mode), and the model config its tokenizer manager loaded. ``EngineState``
carries those facts; ``engine.py`` gathers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openengine_gateway import pb
from openengine_gateway.spi import Load, LoraAdapter, RankLoad

from .mapping import MAX_CANDIDATES, EngineLimits, eos_token_ids

ENGINE_NAME = "sglang"

ALL_GUIDED_MODES = (
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA,
    pb.GUIDED_DECODING_MODE_REGEX,
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR,
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG,
    pb.GUIDED_DECODING_MODE_CHOICE,
    pb.GUIDED_DECODING_MODE_JSON_OBJECT,
)
GUIDED_MODES_BY_BACKEND: Mapping[str, tuple[pb.GuidedDecodingMode.ValueType, ...]] = {
    "xgrammar": ALL_GUIDED_MODES,
    "llguidance": ALL_GUIDED_MODES,
    # SGLang's outlines backend compiles JSON schemas and regexes only (choice and JSON object map onto them).
    "outlines": (
        pb.GUIDED_DECODING_MODE_JSON_SCHEMA,
        pb.GUIDED_DECODING_MODE_REGEX,
        pb.GUIDED_DECODING_MODE_CHOICE,
        pb.GUIDED_DECODING_MODE_JSON_OBJECT,
    ),
}
_CANDIDATE_MODES = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)
_ROLES = {"prefill": pb.ENGINE_ROLE_PREFILL, "decode": pb.ENGINE_ROLE_DECODE}
_HANDOFF_TOP_LOGPROBS = 128
"""Top candidates a prefill hands its decode with the first token (the default capacity of
SGLang's disaggregation ``MetadataBuffers``, which its scheduler does not change)."""
_RESERVED = 4
"""SGLang admits prompts below ``max_req_input_len = max_req_len - 5`` and outputs up to
``max_req_len - prompt - 1`` tokens: the usable context is ``max_req_input_len + 4``."""


@dataclass(frozen=True, slots=True)
class EngineState:
    """What a started SGLang engine is, read once after it started."""

    server: Mapping[str, Any]
    """Resolved server arguments plus the scheduler's internal state (DP rank 0)."""
    context_len: int
    max_req_input_len: int
    vocab_size: int
    is_generation: bool = True
    is_multimodal: bool = False
    has_tokenizer: bool = True
    architectures: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    matryoshka: bool = False
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    eos_token_ids: tuple[int, ...] = ()
    reserved_tokens: int = 0
    """Output slots SGLang reserves per request on top of its tokens (EAGLE speculative decoding's
    draft tokens, ``TokenizerManager.num_reserved_tokens``): they count against the context."""

    @property
    def max_context(self) -> int:
        """Prompt plus output tokens one request may hold."""
        return self.max_req_input_len + _RESERVED - self.reserved_tokens

    @property
    def max_prompt(self) -> int:
        """The longest prompt SGLang admits."""
        return self.max_req_input_len - 1 - self.reserved_tokens

    @property
    def page_size(self) -> int:
        """Tokens per KV page as SGLang's radix tree, allocator and KV events count them.

        That is ``--page-size`` widened by decode context parallelism: under DCP the tree and the
        allocator page at ``page_size * dcp_size``, the block size KV events carry
        (``arg_groups/overrides.py`` ``kv_event_block_size_of``).
        """
        return int(self.server.get("page_size") or 1) * int(self.server.get("dcp_size") or 1)

    @property
    def token_capacity(self) -> int | None:
        """KV tokens one DP rank holds (``max_total_num_tokens``)."""
        memory = self.server.get("memory_usage") or {}
        capacity = memory.get("token_capacity")
        return int(capacity) if capacity else None

    @property
    def classifier(self) -> bool:
        """A sequence-classification model SGLang serves as an embedding model."""
        return not self.is_generation and any(a.endswith("ForSequenceClassification") for a in self.architectures)


def engine_state(manager: Any, server: dict[str, Any]) -> EngineState:
    """The started engine's facts, from its tokenizer manager and internal state."""
    config, tokenizer = manager.model_config, manager.tokenizer
    hf_config = config.hf_config
    id2label = getattr(hf_config, "id2label", None) or {}
    return EngineState(
        server=server,
        context_len=config.context_len,
        max_req_input_len=manager.max_req_input_len,
        vocab_size=config.vocab_size,
        is_generation=bool(config.is_generation),
        is_multimodal=bool(config.is_multimodal),
        has_tokenizer=tokenizer is not None,
        architectures=tuple(getattr(hf_config, "architectures", None) or ()),
        labels=tuple(str(id2label[key]) for key in sorted(id2label)),
        matryoshka=bool(getattr(config, "is_matryoshka", False)),
        sampling_defaults=config.get_default_sampling_params(),
        eos_token_ids=eos_token_ids(
            getattr(tokenizer, "eos_token_id", None),
            getattr(tokenizer, "additional_stop_token_ids", None),
            config.hf_eos_token_id,
        ),
        reserved_tokens=int(getattr(manager, "num_reserved_tokens", 0) or 0),
    )


def startup_adapters(manager: Any) -> list[LoraAdapter]:
    """The adapters SGLang loaded from ``--lora-paths``; the gateway numbers them from 1."""
    adapters = manager.lora_registry.get_all_adapters()
    return [
        LoraAdapter(lora_id=number, lora_name=name, source_path=str(adapters[name].lora_path or ""))
        for number, name in enumerate(sorted(adapters), start=1)
    ]


def grammar_backend(server: Mapping[str, Any]) -> str | None:
    """The engine's grammar backend (SGLang resolves an unset one to xgrammar); None when off."""
    backend = server.get("grammar_backend") or "xgrammar"
    return None if backend == "none" else str(backend)


def engine_role(server: Mapping[str, Any]) -> pb.EngineRole.ValueType:
    """PREFILL or DECODE from ``disaggregation_mode``; AGGREGATED otherwise."""
    return _ROLES.get(str(server.get("disaggregation_mode") or "null"), pb.ENGINE_ROLE_AGGREGATED)


def dp_size(server: Mapping[str, Any]) -> int:
    """Data-parallel replicas (``dp_size`` resolved): what SGLang's runtime LoRA loading asserts is 1."""
    return int(server.get("dp_size") or 1)


def dp_ranks(server: Mapping[str, Any]) -> int:
    """Data-parallel ranks this engine drives: replicas times attention-DP groups.

    SGLang's ``num_dp_ranks_of`` (``runtime_context.py``): ``--dp-size N --enable-dp-attention``
    resolves to ``attn_dp_size=N, dp_size=1`` (``arg_groups/parallel_hook.py``), and each
    attention-DP rank has its own scheduler, KV cache, KV-event publisher and load snapshot.
    """
    return dp_size(server) * int(server.get("attn_dp_size") or 1)


def engine_limits(state: EngineState) -> EngineLimits:
    """The per-request mapping's view of the engine."""
    server = state.server
    return EngineLimits(
        max_context=state.max_context,
        max_prompt=state.max_prompt,
        vocab_size=state.vocab_size,
        eos_token_ids=state.eos_token_ids,
        sampling_defaults=state.sampling_defaults,
        grammar_backend=grammar_backend(server),
        priority_scheduling=bool(server.get("enable_priority_scheduling")),
        low_priority_values_first=bool(server.get("schedule_low_priority_values_first")),
        deterministic=bool(server.get("enable_deterministic_inference")),
        dp_size=dp_size(server),
        dp_ranks=dp_ranks(server),
        role=engine_role(server),
        transfer_backend=transfer_backend(server),
        has_tokenizer=state.has_tokenizer,
    )


def transfer_backend(server: Mapping[str, Any]) -> str:
    """The disaggregation transfer backend (mooncake, nixl...), empty when not disaggregated."""
    if engine_role(server) == pb.ENGINE_ROLE_AGGREGATED:
        return ""
    return str(server.get("disaggregation_transfer_backend") or "")


def lora_enabled(server: Mapping[str, Any]) -> bool:
    """``--enable-lora``, or adapters given at start (which enable it)."""
    return bool(server.get("enable_lora") or server.get("lora_paths"))


def model_info(state: EngineState) -> pb.ModelInfo:
    """The advertised capabilities of the model a started engine serves (tasks excluded)."""
    server = state.server
    info = pb.ModelInfo(
        model_id=str(server.get("model_path") or ""),
        max_context_length=state.max_context,
        kv_block_size=state.page_size,
        supports_text_input=state.has_tokenizer,
        supports_token_ids_input=True,
        supports_lora=lora_enabled(server),
        supports_multimodal=state.is_multimodal and state.is_generation,
        reasoning_parser=str(server.get("reasoning_parser") or ""),
        tool_call_parser=str(server.get("tool_call_parser") or ""),
    )
    capacity = state.token_capacity
    if capacity:
        info.total_kv_blocks = capacity // state.page_size
    running = server.get("effective_max_running_requests_per_dp") or server.get("max_running_requests")
    if running:
        info.max_running_requests = int(running)
    batched = max_batched_tokens(server)
    if batched:
        info.max_batched_tokens = batched
    if server.get("tokenizer_mode"):
        info.tokenizer_modes.append(str(server["tokenizer_mode"]))
    if state.is_generation:
        info.generation.CopyFrom(generation_capabilities(state))
    return info


def max_batched_tokens(server: Mapping[str, Any]) -> int | None:
    """Tokens one prefill batch takes: the chunk size, or ``max_prefill_tokens`` without chunking."""
    chunk = server.get("chunked_prefill_size")
    if chunk and int(chunk) > 0:
        return int(chunk)
    prefill = server.get("max_prefill_tokens")
    return int(prefill) if prefill else None


def logprob_capabilities(vocab_size: int) -> pb.LogprobCapabilities:
    """Top N and explicit ids up to ``MAX_CANDIDATES`` (SGLang caps none, but detokenizes each candidate on
    the gateway's loop); "all" only for a vocabulary within that bound."""
    modes = _CANDIDATE_MODES if vocab_size <= MAX_CANDIDATES else _CANDIDATE_MODES[:2]
    return pb.LogprobCapabilities(
        supported=True, candidate_selection_modes=modes, max_top_n=min(vocab_size, MAX_CANDIDATES)
    )


def guided_capabilities(backend: str | None) -> pb.GuidedDecodingCapabilities:
    """The guide kinds the engine's grammar backend compiles (none without one)."""
    if backend is None:
        return pb.GuidedDecodingCapabilities(supported=False)
    return pb.GuidedDecodingCapabilities(supported=True, modes=GUIDED_MODES_BY_BACKEND.get(backend, ()))


def handoff_logprob_capabilities(vocab_size: int) -> pb.LogprobCapabilities:
    """Output logprobs of a disaggregated engine: top N within what a prefill hands its decode.

    The first token's scores travel in the handoff's metadata: more top candidates than it holds
    fail the prefill, and it carries no explicit-id scores (the decode reports that row empty).
    """
    top_n = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N
    return pb.LogprobCapabilities(
        supported=True, candidate_selection_modes=[top_n], max_top_n=min(vocab_size, _HANDOFF_TOP_LOGPROBS)
    )


def generation_capabilities(state: EngineState) -> pb.GenerationCapabilities:
    """Logprob, guided-decoding and scheduling options the engine honours.

    A disaggregated engine computes no prompt logprobs (the decode skips the prompt, and the
    driver ends a prefill's stream at its handoff) and hands over only the top candidates.
    """
    server = state.server
    if engine_role(server) == pb.ENGINE_ROLE_AGGREGATED:
        prompt = output = logprob_capabilities(state.vocab_size)
    else:
        prompt, output = pb.LogprobCapabilities(supported=False), handoff_logprob_capabilities(state.vocab_size)
    return pb.GenerationCapabilities(
        prompt_logprobs=prompt,
        output_logprobs=output,
        guided_decoding=guided_capabilities(grammar_backend(server) if state.has_tokenizer else None),
        supports_priority=bool(server.get("enable_priority_scheduling")),
        supports_stop_in_output=True,
        supports_cache_salt=True,
        supports_prefix_cache_bypass=False,
    )


def parallelism(server: Mapping[str, Any]) -> pb.ParallelismInfo:
    """Tensor, pipeline and data parallel sizes; this engine drives DP ranks 0 .. dp_ranks - 1."""
    return pb.ParallelismInfo(
        tensor_parallel_size=int(server.get("tp_size") or 1),
        pipeline_parallel_size=int(server.get("pp_size") or 1),
        data_parallel_size=dp_ranks(server),
        data_parallel_start_rank=0,
    )


def kv_connector(server: Mapping[str, Any], bootstrap_host: str) -> pb.KvConnectorInfo | None:
    """The disaggregation transfer, when the engine is a prefill or decode engine.

    A prefill serves its KV through SGLang's bootstrap server (advertised as its local
    endpoint); the decode side attaches to a remote prefill, which pushes the KV to it.
    """
    role = engine_role(server)
    if role == pb.ENGINE_ROLE_AGGREGATED:
        return None
    info = pb.KvConnectorInfo(
        enabled=True,
        transfer_backend=transfer_backend(server),
        supports_remote_prefill=role == pb.ENGINE_ROLE_DECODE,
        supports_decode_pull=False,
        supports_abort_cleanup=True,
    )
    if role == pb.ENGINE_ROLE_PREFILL:
        port = int(server.get("disaggregation_bootstrap_port") or 0)
        info.local_endpoints.add(host=bootstrap_host, port=port, protocol="http")
    return info


def load_info(snapshots: Sequence[Any], *, page_size: int, kv_sessions: int) -> Load:
    """A load snapshot from SGLang's per-rank ``LoadSnapshot`` records (``get_loads``).

    Used blocks are the rank's used KV tokens in pages, rounded up. ``kv_sessions`` counts the
    prefills this driver holds for a decode engine to attach (zero on other engines).
    """
    ranks = [
        RankLoad(
            data_parallel_rank=snapshot.dp_rank,
            running_requests=snapshot.num_running_reqs,
            queued_requests=snapshot.num_waiting_reqs,
            used_kv_blocks=-(-snapshot.num_used_tokens // page_size),
            total_kv_blocks=snapshot.max_total_num_tokens // page_size,
        )
        for snapshot in sorted(snapshots, key=lambda s: s.dp_rank)
    ]
    stamps = [snapshot.timestamp for snapshot in snapshots if snapshot.timestamp]
    return Load(
        timestamp_unix_nanos=int(min(stamps) * 1e9) if stamps else None,
        running_requests=sum(snapshot.num_running_reqs for snapshot in snapshots),
        queued_requests=sum(snapshot.num_waiting_reqs for snapshot in snapshots),
        active_kv_sessions=kv_sessions,
        used_kv_blocks=sum(rank.used_kv_blocks or 0 for rank in ranks),
        total_kv_blocks=sum(rank.total_kv_blocks or 0 for rank in ranks),
        ranks=ranks,
    )


__all__ = [
    "ALL_GUIDED_MODES",
    "ENGINE_NAME",
    "GUIDED_MODES_BY_BACKEND",
    "EngineState",
    "dp_ranks",
    "dp_size",
    "engine_limits",
    "engine_role",
    "engine_state",
    "generation_capabilities",
    "grammar_backend",
    "guided_capabilities",
    "handoff_logprob_capabilities",
    "kv_connector",
    "load_info",
    "logprob_capabilities",
    "lora_enabled",
    "max_batched_tokens",
    "model_info",
    "parallelism",
    "startup_adapters",
    "transfer_backend",
]
