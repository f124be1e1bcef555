"""The later layout (``pb_later``) is upstream's at the pinned commit, in a descriptor pool of its own.

``LATER_SCHEMA`` transcribes, from upstream ai-dynamo/openengine at ``pb_later.SCHEMA_RELEASE`` (the
proto files TensorRT-LLM vendors at that commit), every type whose wire shape differs from the seed's
or is new; each is compared with the generated descriptors in the notation of test_proto_schema. The
ErrorCode numbering is also what Dynamo 1.6.1's sidecar decodes (its ``ErrorCode`` has 12 values,
INTERNAL = 11; docs/layouts.md says how that was read).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from openengine_gateway import pb, pb_later

from tests.test_proto_schema import parse_spec, render_file

LATER_SCHEMA = """
message GenerateRequest {
  string request_id = 1;
  string model = 2;
  oneof input {
    string prompt = 3;
    TokenIds token_ids = 4;
  }
  SamplingParams sampling = 5;
  StoppingOptions stopping = 6;
  ResponseOptions response = 7;
  KvOptions kv = 8;
  GuidedDecoding guided = 9;
  repeated MediaItem media = 10;
  string lora_name = 11;
  google.protobuf.Struct extra = 12;
}

message KvOptions {
  KvSessionRef session = 1;
  optional bool bypass_prefix_cache = 2;
  optional string cache_salt = 3;
}

message EngineError {
  ErrorCode code = 1;
  string message = 2;
  bool retryable = 3;
}

enum ErrorCode {
  ERROR_CODE_UNSPECIFIED = 0;
  ERROR_CODE_INVALID_ARGUMENT = 1;
  ERROR_CODE_UNSUPPORTED_FEATURE = 2;
  ERROR_CODE_ROLE_MISMATCH = 3;
  ERROR_CODE_MODEL_NOT_FOUND = 4;
  ERROR_CODE_OVERLOADED = 5;
  ERROR_CODE_REQUEST_NOT_FOUND = 6;
  ERROR_CODE_DUPLICATE_REQUEST = 7;
  ERROR_CODE_KV_SESSION_NOT_FOUND = 8;
  ERROR_CODE_KV_TRANSFER_FAILED = 9;
  ERROR_CODE_CANCELLED = 10;
  ERROR_CODE_INTERNAL = 11;
}

enum HealthState {
  HEALTH_STATE_UNSPECIFIED = 0;
  HEALTH_STATE_STARTING = 1;
  HEALTH_STATE_READY = 2;
  HEALTH_STATE_DEGRADED = 3;
  HEALTH_STATE_NOT_READY = 4;
}

message KvConnectorInfo {
  optional bool enabled = 1;
  string transfer_backend = 2;
  repeated KvEndpoint local_endpoints = 3;
  repeated string supported_protocols = 4;
  optional bool supports_remote_prefill = 5;
  optional bool supports_decode_pull = 6;
  optional bool supports_abort_cleanup = 7;
  optional uint32 schema_version = 8;
}

message ServerInfo {
  string engine_name = 1;
  string engine_version = 2;
  EngineRole engine_role = 3;
  string instance_id = 4;
  repeated string supported_models = 5;
  ParallelismInfo parallelism = 6;
  KvConnectorInfo kv_connector = 7;
  uint32 schema_revision = 8;
  uint32 minimum_client_revision = 9;
  string schema_release = 10;
  DeploymentCapacity capacity = 11;
  google.protobuf.Struct extra = 12;
}

message DeploymentCapacity {
  optional uint32 kv_block_size = 1;
  optional uint64 total_kv_blocks = 2;
  optional uint64 max_running_requests = 3;
  optional uint64 max_batched_tokens = 4;
  optional uint32 max_loras = 5;
}

message ParallelismInfo {
  optional uint32 tensor_parallel_size = 1;
  optional uint32 pipeline_parallel_size = 2;
  optional uint32 data_parallel_size = 3;
  optional uint32 data_parallel_rank = 4;
  optional uint32 data_parallel_start_rank = 5;
  optional uint32 decode_context_parallel_size = 6;
}

message ModelInfo {
  string model_id = 1;
  string served_model_name = 2;
  repeated string served_model_aliases = 3;
  optional uint32 max_context_length = 4;
  optional uint32 max_output_tokens = 5;
  repeated string tokenizer_modes = 10;
  optional bool supports_text_input = 20;
  optional bool supports_token_ids_input = 21;
  GenerationCapabilities generation = 22;
  optional bool supports_lora = 23;
  optional bool supports_multimodal = 24;
  string reasoning_parser = 25;
  string tool_call_parser = 26;
  google.protobuf.Struct extra = 28;
}

message LoadInfo {
  string instance_id = 1;
  optional uint64 timestamp_unix_nanos = 2;
  optional uint32 running_requests = 3;
  optional uint32 queued_requests = 4;
  optional uint32 active_kv_sessions = 5;
  optional uint64 used_kv_blocks = 6;
  optional uint64 total_kv_blocks = 7;
  optional uint64 running_tokens = 8;
  optional uint64 waiting_tokens = 9;
  optional uint32 prefill_batch_size = 10;
  optional uint32 decode_batch_size = 11;
  repeated RankLoadInfo ranks = 20;
  google.protobuf.Struct attributes = 30;
}
"""

INFERENCE_RPCS = [("Generate", "GenerateRequest", "GenerateResponse", True)]
CONTROL_RPCS = [
    ("GetServerInfo", "GetServerInfoRequest", "ServerInfo", False),
    ("GetModelInfo", "GetModelInfoRequest", "ModelInfo", False),
    ("GetLoad", "GetLoadRequest", "LoadInfo", False),
    ("Health", "HealthRequest", "HealthResponse", False),
    ("Abort", "AbortRequest", "AbortResponse", False),
    ("LoadLora", "LoadLoraRequest", "LoadLoraResponse", False),
    ("UnloadLora", "UnloadLoraRequest", "UnloadLoraResponse", False),
    ("ListLoras", "ListLorasRequest", "ListLorasResponse", False),
    ("GetKvEventSources", "GetKvEventSourcesRequest", "GetKvEventSourcesResponse", False),
    ("SubscribeKvEvents", "SubscribeKvEventsRequest", "SubscribeKvEventsResponse", True),
]
"""The two services at the pinned commit, as TensorRT-LLM's servicer registers them."""


def _generated() -> dict[str, tuple[str, list[str]]]:
    rendered: dict[str, tuple[str, list[str]]] = {}
    for name in ("error", "generation", "kv", "lifecycle", "lora", "model", "openengine", "server"):
        proto = descriptor_pb2.FileDescriptorProto()
        pb_later.POOL.FindFileByName(f"openengine_later/v1/{name}.proto").CopyToProto(proto)
        assert proto.package == "openengine.v1" and proto.syntax == "proto3" and not proto.HasField("options")
        rendered.update(render_file(proto))
    return rendered


@pytest.mark.parametrize("type_name", sorted(parse_spec(LATER_SCHEMA)))
def test_type_matches_the_pinned_commit(type_name: str) -> None:
    assert _generated()[type_name] == parse_spec(LATER_SCHEMA)[type_name]


def test_what_the_later_layout_dropped() -> None:
    """No seed-only type leaks into the later pool (the tasks, Drain, runtime events, GetEngineInfo)."""
    generated = _generated()
    for gone in ("EmbedRequest", "DrainRequest", "RuntimeEvent", "GetEngineInfoRequest", "EngineInfo", "TaskInput"):
        assert gone not in generated, gone


@pytest.mark.parametrize(
    ("descriptor", "name", "rpcs"),
    [
        (pb_later.INFERENCE_DESCRIPTOR, pb_later.INFERENCE_SERVICE_NAME, INFERENCE_RPCS),
        (pb_later.CONTROL_DESCRIPTOR, pb_later.CONTROL_SERVICE_NAME, CONTROL_RPCS),
    ],
)
def test_service_rpcs(descriptor: object, name: str, rpcs: list[tuple[str, str, str, bool]]) -> None:
    service = pb_later.POOL.FindServiceByName(name)
    assert service is descriptor
    actual = [
        (m.name, m.input_type.name, m.output_type.name, m.server_streaming, m.client_streaming) for m in service.methods
    ]
    assert actual == [(*rpc, False) for rpc in rpcs]


def test_an_own_pool_never_the_default_one() -> None:
    """Same full names, different messages: the seed's stay in the default pool, the later ones in ``POOL``."""
    default = descriptor_pool.Default()
    assert default.FindMessageTypeByName("openengine.v1.GenerateRequest") is pb.GenerateRequest.DESCRIPTOR
    assert pb_later.GenerateRequest.DESCRIPTOR.file.pool is pb_later.POOL
    assert pb_later.GenerateRequest is not pb.GenerateRequest
    assert pb.GenerateRequest.DESCRIPTOR.fields_by_number[12].name == "priority"
    assert pb_later.GenerateRequest.DESCRIPTOR.fields_by_number[12].name == "extra"
    for name in pb_later.SERVICE_NAMES:
        with pytest.raises(KeyError):
            default.FindServiceByName(name)


def test_struct_fields_behave_as_structs() -> None:
    """The later pool's own copy of struct.proto keeps the Struct helpers (``update``, item access)."""
    request = pb_later.GenerateRequest()
    request.extra.update({"temperature_floor": 0.5, "tags": ["a"]})
    assert request.extra["temperature_floor"] == 0.5
    assert pb_later.GenerateRequest.FromString(request.SerializeToString()) == request


def test_pinned_revision_constants() -> None:
    assert (pb_later.SCHEMA_REVISION, pb_later.MINIMUM_CLIENT_REVISION) == (1, 1)
    assert len(pb_later.SCHEMA_RELEASE) == 40 and pb_later.SCHEMA_RELEASE != pb.SCHEMA_RELEASE


def test_generated_modules_import_relatively_and_register_in_their_pool() -> None:
    """The later modules claim no top-level package and never touch the default pool."""
    folder = Path(__file__).resolve().parent.parent / "gateway" / "_generated" / "openengine_later" / "v1"
    modules = sorted(folder.glob("*_pb2.py"))
    assert len(modules) == 8
    for module in modules:
        text = module.read_text()
        assert not re.search(r"^(from|import) openengine", text, re.M), module.name
        assert "_descriptor_pool.Default()" not in text and "_POOL.AddSerializedFile(" in text, module.name
