"""What a started engine advertises and reports, from its arguments, statistics and signature."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from openengine_backends.trtllm.capabilities import (
    HANDOFF_FIELDS_1_2,
    EngineFeatures,
    engine_features,
    kv_connector,
    load_info,
    model_info,
    parallelism,
)
from openengine_backends.trtllm.sampling import TORCH_SAMPLER_KNOBS, TRTLLM_SAMPLER_KNOBS
from openengine_gateway import pb
from openengine_gateway.contract.capabilities import check_model_info

STATS = {
    "numActiveRequests": 3,
    "numQueuedRequests": 2,
    "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 40, "tokensPerBlock": 32},
    "inflightBatchingStats": {"numContextRequests": 1, "numGenRequests": 2, "numPausedRequests": 1},
}


def llm(accepts_priority: bool = False, **args: Any) -> SimpleNamespace:
    def generate_async(inputs: Any, sampling_params: Any = None, cache_salt: Any = None) -> None: ...

    def with_priority(
        inputs: Any, sampling_params: Any = None, cache_salt: Any = None, priority: float = 0.5
    ) -> None: ...

    values: dict[str, Any] = {
        "max_seq_len": None,
        "max_batch_size": 16,
        "max_num_tokens": 4096,
        "kv_cache_config": SimpleNamespace(tokens_per_block=64, event_buffer_max_size=0),
        "guided_decoding_backend": None,
        "enable_lora": False,
        "lora_config": None,
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "enable_attention_dp": False,
        "scheduler_config": SimpleNamespace(waiting_queue_policy="fcfs"),
        "cache_transceiver_config": None,
    }
    return SimpleNamespace(
        args=SimpleNamespace(**{**values, **args}),
        tokenizer=SimpleNamespace(eos_token_id=7),
        _hf_model_config=SimpleNamespace(max_position_embeddings=2048),
        generate_async=with_priority if accepts_priority else generate_async,
    )


def features(
    engine: SimpleNamespace, stats: Any = STATS, role: str = "aggregated", generation_config: Any = None
) -> EngineFeatures:
    return engine_features(
        engine,
        stats=stats,
        role=role,
        max_top_logprobs=20,
        handoff_fields=HANDOFF_FIELDS_1_2,
        generation_config=generation_config or {},
    )


def test_the_started_engine_is_read_off_its_arguments_statistics_and_signature() -> None:
    read = features(llm())
    assert (read.max_seq_len, read.max_batch_size, read.max_num_tokens) == (2048, 16, 4096)
    assert (read.tokens_per_block, read.total_kv_blocks) == (32, 100)
    assert read.eos_token_ids == (7,) and read.cache_salt and not read.priority and not read.kv_events
    publishing = SimpleNamespace(tokens_per_block=64, event_buffer_max_size=8, enable_block_reuse=True)
    assert features(llm(kv_cache_config=publishing)).kv_events
    no_reuse = SimpleNamespace(tokens_per_block=64, event_buffer_max_size=8, enable_block_reuse=False)
    assert not features(llm(kv_cache_config=no_reuse)).kv_events, "TensorRT-LLM records no events without reuse"
    without_stats = features(llm(max_seq_len=512), stats=None)
    assert without_stats.max_seq_len == 512 and without_stats.tokens_per_block == 64
    assert without_stats.total_kv_blocks is None


def test_the_context_length_is_what_the_executor_enforces_not_the_model_config() -> None:
    """``args.max_seq_len`` stays None unless given; the executor's KV cache manager cuts it to the pool."""
    small_pool = {**STATS, "kvCacheStats": {"maxNumBlocks": 10, "tokensPerBlock": 32}}
    assert features(llm(), stats=small_pool).max_seq_len == 320
    assert features(llm(max_seq_len=256), stats=small_pool).max_seq_len == 256
    assert model_info(features(llm(), stats=small_pool), "m").max_context_length == 320


def test_without_chunked_prefill_max_num_tokens_bounds_the_prompt_but_not_a_handoffs() -> None:
    """``LLM._check_arguments`` refuses a prompt over ``max_num_tokens`` unless chunked prefill is on
    or the request is generation-only: the longest context is then ``max_num_tokens`` + 1."""
    # The Llama-3.1 engine: 131,072 positions, a pool that holds them, the default 8,192 batched tokens.
    big_pool = {**STATS, "kvCacheStats": {"maxNumBlocks": 4096, "tokensPerBlock": 32}}
    llama = features(llm(max_num_tokens=8192, max_seq_len=131072), stats=big_pool)
    assert llama.max_context() == model_info(llama, "m").max_context_length == 8193
    assert llama.max_context(generation_only=True) == 131072
    chunked = features(llm(max_num_tokens=8192, max_seq_len=131072, enable_chunked_prefill=True), stats=big_pool)
    assert chunked.max_context() == model_info(chunked, "m").max_context_length == 131072
    decode = dataclasses.replace(llama, role=pb.ENGINE_ROLE_DECODE)  # its requests are handoffs
    assert model_info(decode, "m").max_context_length == 131072


def test_lora_is_advertised_only_with_a_lora_config() -> None:
    """Without ``lora_config`` TensorRT-LLM's worker ignores a ``lora_request`` (``enable_lora`` is for TRT engines)."""
    assert not features(llm(enable_lora=True)).lora
    assert features(llm(lora_config=SimpleNamespace(max_loras=2))).lora


def test_the_sampler_decides_which_knobs_apply_and_the_defaults() -> None:
    assert features(llm()).sampler_knobs == TORCH_SAMPLER_KNOBS
    assert features(llm(sampler_type="TRTLLMSampler")).sampler_knobs == TRTLLM_SAMPLER_KNOBS
    speculative = llm(sampler_type="TRTLLMSampler", speculative_config=SimpleNamespace(decoding_type="Eagle"))
    assert features(speculative).sampler_knobs == TORCH_SAMPLER_KNOBS
    config = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1}
    torch = features(llm(), generation_config=config).sampling
    assert torch.values == {"temperature": 0.6, "top_p": 0.9, "top_k": 0} and torch.dropped == {
        "repetition_penalty": 1.1
    }
    applied = features(llm(sampler_type="TRTLLMSampler"), generation_config=config).sampling
    assert applied.values == {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.1}
    assert not applied.dropped


def test_speculative_decoding_offers_only_the_sampled_tokens_logprob() -> None:
    """TensorRT-LLM's speculative samplers refuse more than one logprob per token."""
    assert features(llm()).max_top_logprobs == 20
    assert features(llm(speculative_config=SimpleNamespace(decoding_type="Eagle"))).max_top_logprobs == 1


def test_priority_is_advertised_only_when_taken_and_scheduled_by() -> None:
    assert not features(llm(accepts_priority=True)).priority
    ordered = SimpleNamespace(waiting_queue_policy="WaitingQueuePolicy.PRIORITY")
    assert not features(llm(scheduler_config=ordered)).priority
    assert features(llm(accepts_priority=True, scheduler_config=ordered)).priority


def test_model_info_tells_the_truth_and_passes_the_contracts_checks() -> None:
    info = model_info(features(llm(guided_decoding_backend="llguidance", lora_config=SimpleNamespace())), "/models/m")
    check_model_info(info)
    assert (info.max_context_length, info.kv_block_size, info.total_kv_blocks) == (2048, 32, 100)
    generation = info.generation
    assert not generation.prompt_logprobs.supported and generation.prompt_logprobs.HasField("supported")
    assert list(generation.output_logprobs.candidate_selection_modes) == [pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N]
    assert generation.output_logprobs.max_top_n == 20 and generation.max_num_sequences == 1
    assert pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG not in generation.guided_decoding.modes
    assert pb.GUIDED_DECODING_MODE_CHOICE in generation.guided_decoding.modes
    assert generation.supports_stop_in_output and not generation.supports_prefix_cache_bypass
    assert info.supports_lora and not info.supports_multimodal
    assert all(task.HasField("supported") and not task.supported for task in (info.tasks.embed, info.tasks.score))


def test_guidance_without_a_grammar_backend_is_advertised_unsupported() -> None:
    guided = model_info(features(llm()), "m").generation.guided_decoding
    assert guided.HasField("supported") and not guided.supported and not guided.modes
    xgrammar = model_info(features(llm(guided_decoding_backend="xgrammar")), "m").generation.guided_decoding
    assert len(xgrammar.modes) == 6


def test_attention_dp_ranks_and_disaggregation_roles() -> None:
    adp = features(llm(enable_attention_dp=True, tensor_parallel_size=4))
    assert parallelism(adp).data_parallel_size == 4 and parallelism(features(llm())).data_parallel_size == 1
    transceiver = SimpleNamespace(backend="NIXL")
    prefill = features(llm(cache_transceiver_config=transceiver), role="prefill")
    connector = kv_connector(prefill)
    assert connector is not None and connector.transfer_backend == "nixl"
    # TensorRT-LLM 1.2.1 finishes a prefill at its handoff and keeps its KV cache where no call reaches it.
    assert connector.HasField("supports_abort_cleanup") and not connector.supports_abort_cleanup
    decode = kv_connector(dataclasses.replace(prefill, role=pb.ENGINE_ROLE_DECODE))
    # It resumes from the prefill's handoff, with no pull channel: TensorRT-LLM's own servicer says false too.
    assert decode is not None and decode.supports_remote_prefill and not decode.supports_decode_pull
    assert not decode.supports_abort_cleanup
    assert kv_connector(features(llm())) is None


def test_load_reads_the_latest_statistics_and_zeroes_an_idle_engine() -> None:
    busy = load_info(STATS, in_flight=2, total_blocks=100, timestamp_ns=5)
    assert (busy.running_requests, busy.queued_requests, busy.used_kv_blocks, busy.total_kv_blocks) == (3, 3, 40, 100)
    assert (busy.prefill_batch_size, busy.decode_batch_size, busy.timestamp_unix_nanos) == (1, 2, 5)
    assert busy.active_kv_sessions is None
    idle = load_info(STATS, in_flight=0, total_blocks=100, timestamp_ns=9)
    assert (idle.running_requests, idle.queued_requests, idle.used_kv_blocks) == (0, 0, 0)
    assert idle.active_kv_sessions is None, "the driver holds no KV session: their count is unknown"
    prefill = load_info(STATS, in_flight=0, total_blocks=100, timestamp_ns=9, kv_outlives_requests=True)
    assert prefill.running_requests == 0 and prefill.used_kv_blocks is None
    unknown = load_info(None, in_flight=1, total_blocks=None, timestamp_ns=1)
    assert unknown.running_requests is None and unknown.total_kv_blocks is None
