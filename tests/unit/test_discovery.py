"""``core.discovery``: EngineInfo, ModelInfo, LoadInfo and KV-source discovery."""

from __future__ import annotations

from dataclasses import replace

import pytest
from openengine_gateway import __version__, pb
from openengine_gateway.core.discovery import GATEWAY_ENGINE_NAME, DiscoveryService
from openengine_gateway.errors import Internal, InvalidArgument, NotFound
from openengine_gateway.spi import Endpoint, KvEventSource, Load, RankLoad

from tests.fakes import FakeBackend, engine_set

PARALLEL = pb.ParallelismInfo(tensor_parallel_size=2, data_parallel_size=1, data_parallel_rank=0)
CONNECTOR = pb.KvConnectorInfo(enabled=True, transfer_backend="nixl", supports_drain=False)


def discovery(
    *backends: FakeBackend | tuple[FakeBackend, str] | tuple[FakeBackend, str, list[str]],
) -> DiscoveryService:
    return DiscoveryService(engine_set(*backends), instance_id="gw-1", advertise_host="node.example")


# -- EngineInfo -----------------------------------------------------------------------------------


def test_engine_info_schema_fields() -> None:
    info = discovery(FakeBackend()).engine_info(pb.GetEngineInfoRequest())
    assert info.schema_revision == 1
    assert info.minimum_client_revision == 1
    assert info.schema_release == "d0f29fec31f31db5cfd49cf3e0f67da84d10c709"


def test_single_engine_identity() -> None:
    backend = FakeBackend(
        engine_name="vllm",
        engine_version="0.32.0",
        role=pb.ENGINE_ROLE_DECODE,
        parallelism=PARALLEL,
        kv_connector=CONNECTOR,
    )
    info = discovery((backend, "llama", ["default"])).engine_info()
    assert (info.engine_name, info.engine_version, info.role, info.instance_id) == (
        "vllm",
        "0.32.0",
        pb.ENGINE_ROLE_DECODE,
        "gw-1",
    )
    assert list(info.supported_models) == ["llama", "default"]
    assert info.parallelism == PARALLEL
    assert not info.parallelism.HasField("pipeline_parallel_size")  # unreported stays absent
    assert info.parallelism.HasField("data_parallel_rank")  # a reported zero stays present
    assert info.kv_connector == CONNECTOR
    assert info.kv_connector.HasField("supports_drain") and not info.kv_connector.supports_drain


def test_engine_without_a_connector_reports_it_disabled() -> None:
    info = discovery(FakeBackend()).engine_info()
    assert info.kv_connector.HasField("enabled") and not info.kv_connector.enabled


def test_several_engines_of_one_kind() -> None:
    first = FakeBackend(engine_name="vllm", engine_version="1", parallelism=PARALLEL, kv_connector=CONNECTOR)
    second = FakeBackend(engine_name="vllm", engine_version="1", parallelism=PARALLEL, kv_connector=CONNECTOR)
    info = discovery((first, "a", ["a2"]), (second, "b")).engine_info()
    assert (info.engine_name, info.engine_version, info.role) == ("vllm", "1", pb.ENGINE_ROLE_AGGREGATED)
    assert list(info.supported_models) == ["a", "a2", "b"]
    assert info.kv_connector == CONNECTOR
    # parallelism describes the shared rank space: one rank each, the common tensor size
    assert info.parallelism == pb.ParallelismInfo(
        tensor_parallel_size=2, data_parallel_size=2, data_parallel_start_rank=0
    )


def test_several_engines_that_disagree() -> None:
    first = FakeBackend(engine_name="vllm", engine_version="1", parallelism=PARALLEL, kv_connector=CONNECTOR)
    second = FakeBackend(engine_name="sglang", engine_version="2", role=pb.ENGINE_ROLE_PREFILL)
    info = discovery((first, "a"), (second, "b")).engine_info()
    assert (info.engine_name, info.engine_version) == (GATEWAY_ENGINE_NAME, __version__)
    assert info.role == pb.ENGINE_ROLE_UNSPECIFIED
    assert not info.HasField("kv_connector")
    # tensor sizes differ (2 vs unreported): absent; the rank space is still described
    assert info.parallelism == pb.ParallelismInfo(data_parallel_size=2, data_parallel_start_rank=0)
    assert info.instance_id == "gw-1"


def test_same_engine_kind_with_different_versions() -> None:
    info = discovery((FakeBackend(engine_version="1"), "a"), (FakeBackend(engine_version="2"), "b")).engine_info()
    assert info.engine_name == "fake" and info.engine_version == ""


def test_kv_connector_rpc() -> None:
    assert discovery(FakeBackend(kv_connector=CONNECTOR)).kv_connector() == CONNECTOR
    mixed = discovery((FakeBackend(kv_connector=CONNECTOR), "a"), (FakeBackend(), "b")).kv_connector()
    assert mixed == pb.KvConnectorInfo()  # every field unknown


# -- ModelInfo ------------------------------------------------------------------------------------


def test_model_info_by_name_or_alias_keeps_presence() -> None:
    model = pb.ModelInfo(
        supports_token_ids_input=False, supports_lora=False, generation=pb.GenerationCapabilities(max_num_sequences=4)
    )
    service = discovery((FakeBackend(model=model), "llama", ["l"]), (FakeBackend(), "other"))
    info = service.model_info(pb.GetModelInfoRequest(model="l"))
    assert info.served_model_name == "llama" and list(info.served_model_aliases) == ["l"]
    assert info.HasField("supports_token_ids_input") and not info.supports_token_ids_input
    assert info.HasField("supports_lora") and not info.supports_lora
    assert not info.HasField("max_context_length") and not info.HasField("supports_text_input")
    assert not info.generation.HasField("supports_priority")
    assert not info.HasField("tasks")


def test_model_info_needs_a_known_model() -> None:
    service = discovery(FakeBackend())
    with pytest.raises(InvalidArgument, match="model is required"):
        service.model_info(pb.GetModelInfoRequest())
    with pytest.raises(NotFound, match="served models"):
        service.model_info(pb.GetModelInfoRequest(model="nope"))


# -- LoadInfo -------------------------------------------------------------------------------------


async def test_single_engine_load_keeps_presence() -> None:
    backend = FakeBackend()
    backend.load_info = Load(
        running_requests=0,
        used_kv_blocks=3,
        ranks=[RankLoad(data_parallel_rank=0, running_requests=0)],
        attributes={"k": "v"},
    )
    service = discovery(backend)
    load = await service.load(pb.GetLoadRequest(include_per_rank=True))
    assert load.instance_id == "gw-1" and load.timestamp_unix_nanos > 0
    assert load.HasField("running_requests") and load.running_requests == 0
    assert not load.HasField("queued_requests")
    assert len(load.ranks) == 1 and load.ranks[0].HasField("running_requests")
    assert dict(load.attributes) == {"k": "v"}
    assert not (await service.load(pb.GetLoadRequest())).ranks  # per-rank only when asked
    assert len(backend.load_info.ranks) == 1  # the driver's snapshot is not mutated


async def test_engine_timestamp_is_kept() -> None:
    backend = FakeBackend()
    backend.load_info = Load(timestamp_unix_nanos=5)
    assert (await discovery(backend).load(pb.GetLoadRequest())).timestamp_unix_nanos == 5


async def test_loads_are_summed_where_every_engine_reports() -> None:
    first, second = FakeBackend(), FakeBackend()
    first.load_info = Load(
        running_requests=2,
        queued_requests=1,
        used_kv_blocks=0,
        ranks=[RankLoad(data_parallel_rank=0)],
        attributes={"a": "1"},
    )
    second.load_info = Load(
        running_requests=3,
        used_kv_blocks=0,
        total_kv_blocks=9,
        ranks=[RankLoad(data_parallel_rank=0)],
        attributes={"b": "2"},
    )
    load = await discovery((first, "a"), (second, "b")).load(pb.GetLoadRequest(include_per_rank=True))
    assert load.running_requests == 5
    assert load.HasField("used_kv_blocks") and load.used_kv_blocks == 0
    assert not load.HasField("queued_requests")  # one engine cannot say: the sum is unknown
    assert not load.HasField("total_kv_blocks")
    assert [r.data_parallel_rank for r in load.ranks] == [0, 1]  # each engine's rank 0, attributable
    assert dict(load.attributes) == {"a.a": "1", "a.ranks": "0", "b.b": "2", "b.ranks": "1"}
    assert load.instance_id == "gw-1" and load.timestamp_unix_nanos > 0


async def test_ranks_of_several_engines_are_endpoint_ranks() -> None:
    dp2 = pb.ParallelismInfo(data_parallel_size=2, data_parallel_start_rank=4)
    first, second = FakeBackend(parallelism=dp2), FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))
    first.load_info = Load(ranks=[RankLoad(data_parallel_rank=4), RankLoad(data_parallel_rank=5)])
    second.load_info = Load(ranks=[RankLoad(data_parallel_rank=1), RankLoad(running_requests=1)])
    first.event_sources = [KvEventSource(topic="a5", data_parallel_rank=5, endpoint=Endpoint(host="h", port=0))]
    second.event_sources = [KvEventSource(topic="b0", data_parallel_rank=0, endpoint=Endpoint(host="h", port=0))]
    service = discovery((first, "a"), (second, "b"))
    load = await service.load(pb.GetLoadRequest(include_per_rank=True))
    ranks = [r.data_parallel_rank if r.HasField("data_parallel_rank") else None for r in load.ranks]
    assert ranks == [0, 1, 3, None]  # native 4, 5 of "a"; native 1 of "b"; an unreported rank stays unreported
    assert (load.attributes["a.ranks"], load.attributes["b.ranks"]) == ("0,1", "2,3")
    sources = service.kv_event_sources(pb.GetKvEventSourcesRequest()).sources
    assert [(s.topic, s.data_parallel_rank) for s in sources] == [("a5", 1), ("b0", 2)]
    only_b = service.kv_event_sources(pb.GetKvEventSourcesRequest(data_parallel_ranks=[2, 3])).sources
    assert [s.topic for s in only_b] == ["b0"]
    assert first.event_sources[0].data_parallel_rank == 5  # the driver's list is not mutated
    outside = RankLoad(data_parallel_rank=2)  # outside what "b" advertises
    second.load_info = replace(second.load_info, ranks=[*second.load_info.ranks, outside])
    with pytest.raises(Internal, match=r"advertises ranks 0\.\.1"):
        await service.load(pb.GetLoadRequest(include_per_rank=True))


# -- KV event sources -----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["", "*", "0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0"])
def test_wildcard_hosts_are_replaced(host: str) -> None:
    backend = FakeBackend()
    backend.event_sources = [KvEventSource(transport="zmq", endpoint=Endpoint(host=host, port=5557))]
    (source,) = discovery(backend).kv_event_sources(pb.GetKvEventSourcesRequest()).sources
    assert (source.endpoint_addr.host, source.endpoint_addr.port) == ("node.example", 5557)
    assert backend.event_sources[0].endpoint == Endpoint(host=host, port=5557)  # the driver's list is not mutated


@pytest.mark.parametrize(
    ("replay", "advertised"),
    [
        ("tcp://*:5558", "tcp://node.example:5558"),
        ("tcp://0.0.0.0:5558", "tcp://node.example:5558"),
        ("tcp://[::]:5558", "tcp://node.example:5558"),
        ("tcp://10.1.2.3:5558", "tcp://10.1.2.3:5558"),
        ("ipc:///tmp/replay", "ipc:///tmp/replay"),
        ("", ""),
    ],
)
def test_a_replay_endpoint_is_routable_too(replay: str, advertised: str) -> None:
    backend = FakeBackend()
    backend.event_sources = [KvEventSource(endpoint=Endpoint(host="*", port=5557), replay_endpoint=replay)]
    (source,) = discovery(backend).kv_event_sources(pb.GetKvEventSourcesRequest()).sources
    assert source.replay_endpoint == advertised


def test_an_ipv6_advertise_host_is_bracketed_in_a_replay_endpoint() -> None:
    backend = FakeBackend()
    backend.event_sources = [KvEventSource(replay_endpoint="tcp://*:5558")]
    discovery_service = DiscoveryService(engine_set(backend), instance_id="gw-1", advertise_host="fd00::7")
    (source,) = discovery_service.kv_event_sources(pb.GetKvEventSourcesRequest()).sources
    assert source.replay_endpoint == "tcp://[fd00::7]:5558"


@pytest.mark.parametrize("host", ["10.1.2.3", "node-7", "::1", "127.0.0.1"])
def test_routable_hosts_are_kept(host: str) -> None:
    backend = FakeBackend()
    backend.event_sources = [KvEventSource(endpoint=Endpoint(host=host, port=1))]
    (source,) = discovery(backend).kv_event_sources(pb.GetKvEventSourcesRequest()).sources
    assert source.endpoint_addr.host == host


def test_sources_filtered_by_rank() -> None:
    backend = FakeBackend()
    backend.event_sources = [
        KvEventSource(topic="r0", data_parallel_rank=0, endpoint=Endpoint(host="h", port=0)),
        KvEventSource(topic="r1", data_parallel_rank=1, endpoint=Endpoint(host="h", port=0)),
        KvEventSource(topic="all", endpoint=Endpoint(host="h", port=0)),
    ]
    service = discovery(backend)
    assert [s.topic for s in service.kv_event_sources(pb.GetKvEventSourcesRequest()).sources] == ["r0", "r1", "all"]
    filtered = service.kv_event_sources(pb.GetKvEventSourcesRequest(data_parallel_ranks=[0]))
    assert [s.topic for s in filtered.sources] == ["r0", "all"]
    assert filtered.sources[0].HasField("data_parallel_rank")
