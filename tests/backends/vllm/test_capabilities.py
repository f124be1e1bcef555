"""A started engine's resolved config → capabilities, role, parallelism, load, KV sources."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from openengine_backends.vllm import capabilities as caps
from openengine_backends.vllm.capabilities import EngineFeatures
from openengine_gateway import pb
from openengine_gateway.contract.capabilities import check_model_info
from openengine_gateway.contract.kv_wire import kv_source_to_proto
from openengine_gateway.spi.zmq_kv import zmq_host_port

from .shapes import KVEventsConfig, KVTransferConfig, ParallelConfig, SchedulerConfig, SchedulerStats, VllmConfig

FEATURES = EngineFeatures(
    supported_tasks=("generate",),
    vocab_size=512,
    has_tokenizer=True,
    structured_outputs=True,
    token_id_logprobs=False,
    max_num_sequences=16384,
)
TOP_N, IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


def test_limits_come_from_the_resolved_config() -> None:
    info = caps.model_info(VllmConfig(), FEATURES)
    check_model_info(info)
    assert info.max_context_length == 512 and info.kv_block_size == 16 and info.total_kv_blocks == 1000
    assert info.max_running_requests == 128 and info.max_batched_tokens == 2048
    assert info.supports_text_input and info.supports_token_ids_input
    assert info.HasField("supports_lora") and not info.supports_lora
    assert info.HasField("supports_multimodal") and not info.supports_multimodal
    assert not info.HasField("tasks")


def test_kv_blocks_are_per_data_parallel_rank() -> None:
    four = EngineFeatures(("generate",), 512, True, True, False, 16384, engines=4)
    assert caps.model_info(VllmConfig(), four).total_kv_blocks == 250


def test_logprob_limits_follow_max_logprobs() -> None:
    info = caps.model_info(VllmConfig(), FEATURES).generation
    assert list(info.output_logprobs.candidate_selection_modes) == [TOP_N], "runner V1 mixes a batch's rows"
    assert info.output_logprobs.max_top_n == 20
    assert list(info.prompt_logprobs.candidate_selection_modes) == [TOP_N], "prompt ids need model runner V2"
    unlimited = VllmConfig()
    unlimited.model_config.max_logprobs = -1
    v2 = EngineFeatures(("generate",), 512, True, True, True, 16384)
    info = caps.model_info(unlimited, v2).generation
    assert list(info.prompt_logprobs.candidate_selection_modes) == [TOP_N, IDS, ALL]
    assert list(info.output_logprobs.candidate_selection_modes) == [TOP_N, IDS, ALL]
    assert info.prompt_logprobs.max_top_n == 512
    none = caps.logprob_capabilities(0, 512, token_ids=True)
    assert list(none.candidate_selection_modes) == [IDS] and not none.HasField("max_top_n")


def test_no_prompt_logprobs_where_the_lora_kernels_cannot_score_prompts() -> None:
    lora = VllmConfig(lora_config=object())
    cpu = EngineFeatures(("generate",), 512, True, True, False, 16384, lora_prompt_logprobs=False)
    prompt = caps.model_info(lora, cpu).generation.prompt_logprobs
    assert prompt.HasField("supported") and not prompt.supported and not prompt.candidate_selection_modes
    assert caps.model_info(lora, cpu).generation.output_logprobs.supported
    assert caps.model_info(lora, FEATURES).generation.prompt_logprobs.supported, "a GPU's kernels map prompt rows"
    assert caps.model_info(VllmConfig(), cpu).generation.prompt_logprobs.supported, "without LoRA nothing breaks"


def test_guided_modes_follow_the_engines_backend() -> None:
    assert list(caps.model_info(VllmConfig(), FEATURES).generation.guided_decoding.modes) == list(caps.ALL_GUIDED_MODES)
    config = VllmConfig()
    config.structured_outputs_config.backend = "outlines"
    modes = caps.model_info(config, FEATURES).generation.guided_decoding.modes
    assert pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR not in modes and pb.GUIDED_DECODING_MODE_REGEX in modes
    no_platform = EngineFeatures(("generate",), 512, True, False, False, 16384)
    guided = caps.model_info(VllmConfig(), no_platform).generation.guided_decoding
    assert guided.HasField("supported") and not guided.supported and not guided.modes


def test_priority_only_with_the_priority_scheduler() -> None:
    assert not caps.model_info(VllmConfig(), FEATURES).generation.supports_priority
    config = VllmConfig(scheduler_config=SchedulerConfig(policy="priority"))
    assert caps.model_info(config, FEATURES).generation.supports_priority


def test_pooling_engines_advertise_no_generation() -> None:
    pooling = EngineFeatures(("embed", "token_embed"), 512, True, True, False, 16384)
    assert not caps.model_info(VllmConfig(), pooling).HasField("generation")


def test_role_and_connector_from_the_kv_transfer_config() -> None:
    assert caps.engine_role(VllmConfig()) == pb.ENGINE_ROLE_AGGREGATED
    assert caps.kv_connector(VllmConfig()) is None
    for role, expected in (
        ("kv_producer", pb.ENGINE_ROLE_PREFILL),
        ("kv_consumer", pb.ENGINE_ROLE_DECODE),
        ("kv_both", pb.ENGINE_ROLE_AGGREGATED),
    ):
        config = VllmConfig(kv_transfer_config=KVTransferConfig("NixlConnector", role))
        assert caps.engine_role(config) == expected
    decode = caps.kv_connector(VllmConfig(kv_transfer_config=KVTransferConfig("NixlConnector", "kv_consumer")))
    assert decode == pb.KvConnectorInfo(
        enabled=True,
        transfer_backend="NixlConnector",
        supports_remote_prefill=True,
        supports_decode_pull=True,
        supports_abort_cleanup=False,  # vLLM frees a handed-off prefill's KV only on pull or its timeout
    )


def test_parallelism_sizes() -> None:
    config = VllmConfig(parallel_config=ParallelConfig(2, 1, 4, 0))
    assert caps.parallelism(config) == pb.ParallelismInfo(
        tensor_parallel_size=2,
        pipeline_parallel_size=1,
        data_parallel_size=4,
        data_parallel_rank=0,
        data_parallel_start_rank=0,
    )


def test_load_from_scheduler_stats_per_rank() -> None:
    stats = {0: SchedulerStats(3, 2, 1, 0.25), 1: SchedulerStats(1, 0, 0, 0.5)}
    load = caps.load_info(stats, blocks=100, ranks=[0, 1, 2])
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks, load.total_kv_blocks) == (4, 3, 75, 300)
    assert [(r.data_parallel_rank, r.running_requests, r.used_kv_blocks) for r in load.ranks] == [
        (0, 3, 25),
        (1, 1, 50),
        (2, 0, 0),
    ]
    assert load.ranks[2].queued_requests is not None and load.ranks[2].queued_requests == 0
    unknown = caps.load_info({}, blocks=None, ranks=[0])
    assert unknown.used_kv_blocks is None and unknown.running_requests == 0


def test_kv_event_sources_keep_the_per_rank_endpoint() -> None:
    published = caps.kv_event_sources(
        {
            0: KVEventsConfig(topic="kv"),
            1: KVEventsConfig(endpoint="tcp://10.0.0.5:5558", replay_endpoint="tcp://*:6000"),  # tcp://*:0, bound
            2: KVEventsConfig(endpoint="ipc:///tmp/kv"),  # no host and port to advertise
        }
    )
    sources = [kv_source_to_proto(source) for source in published]
    assert [source.data_parallel_rank for source in sources] == [0, 1]
    assert sources[0].endpoint_addr == pb.KvEndpoint(host="*", port=5557, protocol="tcp")
    assert sources[0].topic == "kv" and sources[0].encoding == "msgpack" and sources[0].data_parallel_rank == 0
    assert sources[1].endpoint_addr.host == "10.0.0.5" and sources[1].data_parallel_rank == 1
    assert sources[1].replay_endpoint == "tcp://*:6000" and sources[1].hwm == 100_000
    assert zmq_host_port("tcp://[::1]:5557") == ("::1", 5557)


@pytest.mark.parametrize(
    ("configured", "served"),
    [
        ("tcp://*:5557", True),
        ("tcp://*:0", True),  # resolved to this node's address in the sources: bound all the same
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("tcp://127.0.0.1:5557", False),  # vLLM connects out to a subscriber of the operator's own
        ("tcp://0.0.0.0:5557", False),
        ("inproc://kv", False),
    ],
)
def test_only_publishers_vllm_binds_are_subscribed_to(configured: str, served: bool) -> None:
    """vLLM's ``ZmqEventPublisher._is_bind_endpoint``: any other endpoint it connects to."""
    config = SimpleNamespace(kv_events_config=KVEventsConfig(endpoint=configured))
    sources = {0: KVEventsConfig(endpoint="tcp://10.0.0.5:41000")}
    assert bool(caps.subscribable(config, sources)) == served
    assert not caps.subscribable(SimpleNamespace(kv_events_config=None), sources)
