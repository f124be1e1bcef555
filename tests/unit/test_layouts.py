"""contract.layouts: the later layout's messages to the seed's and back, in all four directions."""

from __future__ import annotations

import pytest
from google.protobuf import unknown_fields
from openengine_gateway import pb, pb_later
from openengine_gateway.contract import layouts
from openengine_gateway.errors import InvalidArgument


def _full_later_request() -> pb_later.GenerateRequest:
    request = pb_later.GenerateRequest(request_id="r-1", model="m", prompt="hello", lora_name="ad")
    request.sampling.temperature = 0.5
    request.sampling.seed = 7
    request.stopping.max_tokens = 9
    request.stopping.conditions.add(stop_text="\n")
    request.response.return_output_logprobs = True
    request.response.output_candidates.top_n = 2
    request.guided.regex = "a+"
    request.media.add(modality=pb_later.MODALITY_IMAGE, url="http://x/y.png")
    request.kv.bypass_prefix_cache = True
    request.kv.cache_salt = "tenant-a"
    request.kv.session.session_id = "s"
    request.kv.session.attributes_struct.update({"remote_port": 5, "do_remote_decode": True})
    return request


def test_generate_request_round_trip() -> None:
    later = _full_later_request()
    seed = layouts.generate_request_to_seed(later, {"openengine-priority": "-3", "openengine-target-dp-rank": "1"})
    assert seed.kv.bypass_prefix_cache is True and seed.kv.cache_salt == "tenant-a"
    assert seed.kv.data_parallel_rank == 1 and seed.priority == -3
    assert seed.kv.session.attributes_struct["remote_port"] == 5
    assert (seed.prompt, seed.sampling.temperature, seed.guided.regex, seed.media[0].url) == (
        "hello",
        0.5,
        "a+",
        "http://x/y.png",
    )
    back, headers = layouts.generate_request_to_later(seed)
    assert back == later
    assert headers == (("openengine-priority", "-3"), ("openengine-target-dp-rank", "1"))


def test_token_ids_and_absent_kv_stay_absent() -> None:
    later = pb_later.GenerateRequest(model="m", token_ids=pb_later.TokenIds(ids=[1, 2, 3]))
    seed = layouts.generate_request_to_seed(later)
    assert list(seed.token_ids.ids) == [1, 2, 3] and not seed.HasField("kv") and not seed.HasField("priority")
    assert layouts.generate_request_to_later(seed) == (later, ())


def test_extra_is_refused_by_name_unless_accepted() -> None:
    later = pb_later.GenerateRequest(model="m", prompt="p")
    later.extra.update({"speculative_k": 4})
    with pytest.raises(InvalidArgument, match=r"extra\.speculative_k"):
        layouts.generate_request_to_seed(later)
    seed = layouts.generate_request_to_seed(later, accepted_extra={"speculative_k"})
    assert dict(seed.metadata) == {"extra.speculative_k": "4.0"}


@pytest.mark.parametrize(
    ("headers", "name"),
    [({"openengine-priority": "high"}, "openengine-priority"), ({"openengine-target-dp-rank": "-1"}, "dp-rank")],
)
def test_bad_request_metadata_is_refused_by_name(headers: dict[str, str], name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        layouts.generate_request_to_seed(pb_later.GenerateRequest(model="m", prompt="p"), headers)


def test_seed_metadata_has_no_later_place() -> None:
    seed = pb.GenerateRequest(model="m", prompt="p", metadata={"k": "v"})
    with pytest.raises(InvalidArgument, match="metadata"):
        layouts.generate_request_to_later(seed)


def test_seed_bytes_read_as_a_later_request_are_refused() -> None:
    """The seed's priority (12, varint) and kv.bypass_prefix_cache (3, varint) have other wire types in the
    later layout: parsed there, they are unknown fields, which the conversion refuses by number."""
    seed = pb.GenerateRequest(model="m", prompt="p", priority=2)
    misread = pb_later.GenerateRequest.FromString(seed.SerializeToString())
    with pytest.raises(InvalidArgument, match=r"GenerateRequest field number 12"):
        layouts.generate_request_to_seed(misread)
    seed = pb.GenerateRequest(model="m", prompt="p")
    seed.kv.bypass_prefix_cache = True
    misread = pb_later.GenerateRequest.FromString(seed.SerializeToString())
    with pytest.raises(InvalidArgument, match=r"GenerateRequest\.kv field number 3"):
        layouts.generate_request_to_seed(misread)


def test_later_bytes_read_as_a_seed_request_are_detected() -> None:
    later = pb_later.GenerateRequest(model="m", prompt="p")
    later.kv.cache_salt = "tenant-a"
    misread = pb.GenerateRequest.FromString(later.SerializeToString())
    with pytest.raises(InvalidArgument, match=r"kv field number 3"):
        layouts.refuse_unknown_fields(misread, "seed")
    layouts.refuse_unknown_fields(pb.GenerateRequest.FromString(_seed_request().SerializeToString()), "seed")


def _seed_request() -> pb.GenerateRequest:
    seed = pb.GenerateRequest(model="m", prompt="p", priority=1, metadata={"a": "b"})
    seed.kv.data_parallel_rank = 2
    seed.kv.session.attributes_struct.update({"x": [1, "y"]})
    return seed


def test_generate_response_round_trip_and_error_codes() -> None:
    token = pb.GenerateResponse(request_id="r", token=pb.TokenOutput(output_index=0, text="hi"))
    token.token.tokens.add(token_id=5, logprob=-0.25)
    later = layouts.generate_response_to_later(token)
    assert isinstance(later, pb_later.GenerateResponse) and later.token.tokens[0].logprob == -0.25
    assert layouts.generate_response_to_seed(later) == token
    final = pb.GenerateResponse(
        request_id="r",
        error=pb.EngineError(code=pb.ERROR_CODE_INTERNAL, message="boom", retryable=True, retry_after_ms=5),
        usage=pb.Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4),
    )
    later = layouts.generate_response_to_later(final)
    assert later.error.code == pb_later.ERROR_CODE_INTERNAL == 11
    assert later.usage.total_tokens == 4 and not unknown_fields.UnknownFieldSet(later.error)
    back = layouts.generate_response_to_seed(later)
    assert back.error.code == pb.ERROR_CODE_INTERNAL == 12 and not back.error.HasField("retry_after_ms")
    draining = pb.GenerateResponse(error=pb.EngineError(code=pb.ERROR_CODE_DRAINING, retryable=True))
    assert layouts.generate_response_to_later(draining).error.code == pb_later.ERROR_CODE_OVERLOADED


def test_server_info_folds_connector_and_capacity() -> None:
    info = pb.EngineInfo(engine_name="mock", role=pb.ENGINE_ROLE_PREFILL, supported_models=["m", "n"])
    info.parallelism.data_parallel_size = 2
    info.kv_connector.enabled = True
    info.kv_connector.supports_drain = True
    info.kv_connector.schema_version = 3
    models = [pb.ModelInfo(kv_block_size=16, max_running_requests=8), pb.ModelInfo(kv_block_size=16)]
    later = layouts.server_info_to_later(info, models)
    assert (later.schema_revision, later.minimum_client_revision, later.schema_release) == (
        pb_later.SCHEMA_REVISION,
        pb_later.MINIMUM_CLIENT_REVISION,
        pb_later.SCHEMA_RELEASE,
    )
    assert later.engine_role == pb_later.ENGINE_ROLE_PREFILL and later.parallelism.data_parallel_size == 2
    assert later.kv_connector.schema_version == 3 and later.kv_connector.enabled
    assert later.capacity.kv_block_size == 16 and not later.capacity.HasField("max_running_requests")
    seed = layouts.server_info_to_seed(later)
    assert seed.kv_connector.schema_version == 3 and not seed.kv_connector.HasField("supports_drain")
    assert seed.schema_release == pb.SCHEMA_RELEASE and seed.role == pb.ENGINE_ROLE_PREFILL


def test_model_info_moves_capacity() -> None:
    seed = pb.ModelInfo(model_id="m", max_context_length=2048, kv_block_size=16, total_kv_blocks=100)
    seed.generation.supports_cache_salt = True
    seed.tasks.embed.SetInParent()
    later = layouts.model_info_to_later(seed)
    assert later.max_context_length == 2048 and later.generation.supports_cache_salt
    assert not unknown_fields.UnknownFieldSet(later)
    back = layouts.model_info_to_seed(later, pb_later.DeploymentCapacity(kv_block_size=16, total_kv_blocks=100))
    expected = pb.ModelInfo()
    expected.CopyFrom(seed)
    expected.ClearField("tasks")
    assert back == expected


def test_load_attributes_struct_and_strings() -> None:
    seed = pb.LoadInfo(instance_id="i", running_requests=2, attributes={"zone": "a"})
    seed.ranks.add(data_parallel_rank=0, running_requests=2)
    later = layouts.load_to_later(seed)
    assert later.attributes["zone"] == "a" and later.ranks[0].running_requests == 2
    assert layouts.load_to_seed(later) == seed
    later.attributes.update({"ratio": 0.5})
    assert layouts.load_to_seed(later).attributes["ratio"] == "0.5"


def test_health_states_renumbered() -> None:
    seed = pb.HealthResponse(state=pb.HEALTH_STATE_NOT_READY)
    seed.checks.add(name="model", state=pb.HEALTH_STATE_DRAINING)
    later = layouts.health_to_later(seed)
    assert later.state == pb_later.HEALTH_STATE_NOT_READY == 4
    assert later.checks[0].state == pb_later.HEALTH_STATE_NOT_READY
    assert layouts.health_to_seed(later).state == pb.HEALTH_STATE_NOT_READY == 5
    ready = pb.HealthResponse(state=pb.HEALTH_STATE_READY)
    assert layouts.health_to_seed(layouts.health_to_later(ready)) == ready


def test_same_wire_messages_are_recast_and_the_others_are_not() -> None:
    assert {"openengine.v1.AbortRequest", "openengine.v1.SamplingParams", "openengine.v1.Usage"} <= layouts.SAME_WIRE
    differing = {"GenerateRequest", "KvOptions", "EngineError", "GenerateResponse", "KvConnectorInfo", "ModelInfo"}
    differing |= {"LoadInfo", "HealthResponse", "HealthCheck", "ParallelismInfo", "SubscribeKvEventsResponse"}
    assert not {f"openengine.v1.{name}" for name in differing} & layouts.SAME_WIRE
    abort = pb_later.AbortRequest(request_id="x")
    assert layouts.request_to_seed(abort, pb.AbortRequest) == pb.AbortRequest(request_id="x")
    with pytest.raises(TypeError):
        layouts.recast(pb_later.GenerateRequest(), pb.GenerateRequest)


def test_kv_events_error_renumbered() -> None:
    seed = pb.SubscribeKvEventsResponse(error=pb.EngineError(code=pb.ERROR_CODE_INTERNAL))
    assert layouts.kv_events_response_to_later(seed).error.code == pb_later.ERROR_CODE_INTERNAL
    batch = pb.SubscribeKvEventsResponse()
    batch.batch.sequence_number = 4
    assert layouts.kv_events_response_to_seed(layouts.kv_events_response_to_later(batch)) == batch
