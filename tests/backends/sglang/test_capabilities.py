"""A started SGLang engine's configuration → ``ModelInfo``, role, parallelism, KV sources, load."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, kv_publishers, mapping
from openengine_backends.sglang.capabilities import EngineState
from openengine_backends.sglang.tasks import task_capabilities
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_source_to_proto

from .fake_api import LoadSnapshot, resolved


def server(**args: Any) -> dict[str, Any]:
    """``get_internal_state()[0]``: resolved server arguments plus the scheduler's additions."""
    state = resolved({"model_path": "/models/m", **args})
    state["memory_usage"] = {"token_capacity": 65536}
    state["effective_max_running_requests_per_dp"] = 48
    return state


def engine(**args: Any) -> EngineState:
    return EngineState(server=server(**args), context_len=4096, max_req_input_len=4090, vocab_size=32000)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_a_disaggregated_engine_offers_the_logprobs_its_handoff_carries(mode: str) -> None:
    generation = capabilities.generation_capabilities(engine(disaggregation_mode=mode))
    assert generation.prompt_logprobs.HasField("supported") and not generation.prompt_logprobs.supported
    output = generation.output_logprobs
    assert list(output.candidate_selection_modes) == [pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N]
    assert output.supported and output.max_top_n == 128  # SGLang's handoff metadata capacity


def test_speculative_reserved_tokens_count_against_the_context() -> None:
    """EAGLE's draft tokens take output slots: SGLang counts them on top of every request."""
    state = replace(engine(), reserved_tokens=6)
    assert capabilities.model_info(state).max_context_length == 4094 - 6
    limits = capabilities.engine_limits(state)
    assert (limits.max_context, limits.max_prompt) == (4094 - 6, 4089 - 6)


def test_model_info_from_the_started_engine() -> None:
    info = capabilities.model_info(engine(page_size=16, tokenizer_mode="auto", reasoning_parser="qwen3"))
    assert info.model_id == "/models/m"
    assert info.max_context_length == 4094, "max_req_input_len + 4: SGLang's max_req_len - 1"
    assert (info.kv_block_size, info.total_kv_blocks) == (16, 4096)
    assert (info.max_running_requests, info.max_batched_tokens) == (48, 8192)
    assert info.supports_text_input and info.supports_token_ids_input
    assert not info.supports_lora and not info.supports_multimodal
    assert list(info.tokenizer_modes) == ["auto"] and info.reasoning_parser == "qwen3"
    generation = info.generation
    assert generation.supports_stop_in_output and generation.supports_cache_salt
    assert not generation.supports_prefix_cache_bypass and not generation.supports_priority
    assert generation.HasField("supports_priority") and not generation.HasField("max_num_sequences")
    for side in (generation.prompt_logprobs, generation.output_logprobs):  # SGLang detokenizes every candidate
        assert side.supported and side.max_top_n == mapping.MAX_CANDIDATES == 256
        assert pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL not in side.candidate_selection_modes, "32000 would stall"
    assert generation.guided_decoding.supported and len(generation.guided_decoding.modes) == 6


def test_without_chunked_prefill_the_batch_is_max_prefill_tokens() -> None:
    assert capabilities.max_batched_tokens({"chunked_prefill_size": -1, "max_prefill_tokens": 16384}) == 16384


def test_guided_modes_per_grammar_backend_and_priority() -> None:
    outlines = capabilities.model_info(engine(grammar_backend="outlines")).generation.guided_decoding
    assert (
        pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR not in outlines.modes and pb.GUIDED_DECODING_MODE_CHOICE in outlines.modes
    )
    off = capabilities.model_info(engine(grammar_backend="none")).generation.guided_decoding
    assert off.HasField("supported") and not off.supported
    assert capabilities.model_info(engine(enable_priority_scheduling=True)).generation.supports_priority
    limits = capabilities.engine_limits(
        engine(enable_priority_scheduling=True, schedule_low_priority_values_first=True)
    )
    assert limits.priority_scheduling and limits.low_priority_values_first
    assert (limits.max_context, limits.max_prompt) == (4094, 4089)


def test_lora_and_a_skipped_tokenizer() -> None:
    assert capabilities.model_info(engine(lora_paths=["a=/x"])).supports_lora
    bare = replace(engine(), has_tokenizer=False)
    info = capabilities.model_info(bare)
    assert not info.supports_text_input
    assert not info.generation.guided_decoding.supported, "SGLang compiles grammars with the tokenizer"


def test_roles_connector_and_parallelism() -> None:
    prefill = server(disaggregation_mode="prefill", disaggregation_bootstrap_port=9000, dp_size=2, tp_size=4)
    assert capabilities.engine_role(prefill) == pb.ENGINE_ROLE_PREFILL
    connector = capabilities.kv_connector(prefill, "p0")
    assert connector is not None and connector.transfer_backend == "mooncake"
    assert list(connector.local_endpoints) == [pb.KvEndpoint(host="p0", port=9000, protocol="http")]
    decode = capabilities.kv_connector(server(disaggregation_mode="decode"), "d0")
    assert decode is not None and decode.supports_remote_prefill and not decode.local_endpoints
    assert capabilities.kv_connector(server(), "h") is None
    assert capabilities.engine_role(server()) == pb.ENGINE_ROLE_AGGREGATED
    assert capabilities.parallelism(prefill) == pb.ParallelismInfo(
        tensor_parallel_size=4, pipeline_parallel_size=1, data_parallel_size=2, data_parallel_start_rank=0
    )


def test_load_from_sglangs_snapshots() -> None:
    snapshots = [
        LoadSnapshot(timestamp=2.0, dp_rank=1, num_running_reqs=1, num_used_tokens=17, max_total_num_tokens=64),
        LoadSnapshot(timestamp=1.5, dp_rank=0, num_running_reqs=2, num_waiting_reqs=3, max_total_num_tokens=64),
    ]
    load = capabilities.load_info(snapshots, page_size=16, kv_sessions=0)
    assert (load.running_requests, load.queued_requests) == (3, 3)
    assert (load.used_kv_blocks, load.total_kv_blocks) == (2, 8)
    assert [rank.data_parallel_rank for rank in load.ranks] == [0, 1]
    assert load.timestamp_unix_nanos == 1_500_000_000 and load.active_kv_sessions is not None
    assert capabilities.load_info([], page_size=1, kv_sessions=2).active_kv_sessions == 2


def test_task_tables_per_model_kind() -> None:
    generation = task_capabilities(engine())
    assert generation is not None and generation.score.supports_label_token_scoring
    assert not generation.HasField("embed") and list(generation.score.normalizations) == [1, 2]
    embed = task_capabilities(replace(engine(enable_lora=True), is_generation=False, architectures=("BertModel",)))
    assert embed is not None and embed.embed.supported and embed.embed.supports_lora
    assert not embed.embed.supports_normalization and not embed.HasField("score")
    classifier = replace(engine(), is_generation=False, architectures=("BertForSequenceClassification",))
    tasks = task_capabilities(classifier)
    assert tasks is not None and tasks.classify.supported and tasks.score.supported
    assert not tasks.score.supports_label_token_scoring and list(tasks.score.input_types) == [pb.TASK_INPUT_TYPE_TEXT]


def test_attention_dp_ranks_count_as_data_parallel_ranks() -> None:
    """``--dp-size 4 --enable-dp-attention`` resolves to ``attn_dp_size=4, dp_size=1``
    (``arg_groups/parallel_hook.py``): four ranks, each with its own KV-event publisher."""
    config = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600"}
    args = server(dp_size=4, enable_dp_attention=True, tp_size=4, kv_events_config=json.dumps(config))
    assert (args["dp_size"], args["attn_dp_size"]) == (1, 4)
    assert capabilities.parallelism(args).data_parallel_size == 4
    limits = capabilities.engine_limits(replace(engine(), server=args))
    assert (limits.dp_ranks, limits.dp_size) == (4, 1), "runtime LoRA loading asserts only dp_size == 1"
    assert list(kv_publishers.kv_event_publishers(args).values()) == [
        (f"tcp://*:{port}", "") for port in range(5557, 5561)
    ]
    last = kv_source_to_proto(kv_publishers.kv_event_sources(args)[-1])
    assert (last.data_parallel_rank, last.endpoint_addr.port, last.replay_endpoint) == (3, 5560, "tcp://*:5603")


def test_decode_context_parallelism_widens_the_kv_block() -> None:
    """Under DCP SGLang's radix tree, allocator and KV events page at ``page_size * dcp_size``
    (``arg_groups/overrides.py`` ``kv_event_block_size_of``)."""
    state = engine(page_size=16, dcp_size=4)
    info = capabilities.model_info(state)
    assert (info.kv_block_size, info.total_kv_blocks) == (64, 65536 // 64)
    assert state.page_size == 64
