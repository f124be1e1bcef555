"""The committed schema and generated code match the OpenEngine v1 spec exactly.

``SPEC_SCHEMA`` is the spec's message and enum text (comments dropped), transcribed from
``openengine-api-v1.md``; the descriptors of the generated modules are rendered in the same
notation and compared message by message, so a renumbered field, a lost ``optional``, a
moved oneof member or a changed enum value fails with a readable diff.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from openengine_gateway import pb, routes_pb

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "openengine" / "v1"
GENERATED_DIR = ROOT / "gateway" / "_generated" / "openengine" / "v1"
ROUTES_GENERATED_DIR = ROOT / "gateway" / "_generated" / "openengine_gateway" / "v1"
PACKAGE = "openengine.v1"

SPEC_SCHEMA = """
enum EngineRole {
  ENGINE_ROLE_UNSPECIFIED = 0;
  ENGINE_ROLE_AGGREGATED = 1;
  ENGINE_ROLE_PREFILL = 2;
  ENGINE_ROLE_DECODE = 3;
}

message GetEngineInfoRequest {}

message EngineInfo {
  string engine_name = 1;
  string engine_version = 2;
  EngineRole role = 3;
  string instance_id = 4;
  repeated string supported_models = 5;
  ParallelismInfo parallelism = 6;
  KvConnectorInfo kv_connector = 7;
  uint32 schema_revision = 8;
  uint32 minimum_client_revision = 9;
  string schema_release = 10;
}

message ParallelismInfo {
  optional uint32 tensor_parallel_size = 1;
  optional uint32 pipeline_parallel_size = 2;
  optional uint32 data_parallel_size = 3;
  optional uint32 data_parallel_rank = 4;
  optional uint32 data_parallel_start_rank = 5;
}

message GetModelInfoRequest {
  string model = 1;
}

message ModelInfo {
  string model_id = 1;
  string served_model_name = 2;
  repeated string served_model_aliases = 3;
  optional uint32 max_context_length = 4;
  optional uint32 max_output_tokens = 5;
  optional uint32 kv_block_size = 6;
  optional uint64 total_kv_blocks = 7;
  optional uint64 max_running_requests = 8;
  optional uint64 max_batched_tokens = 9;
  repeated string tokenizer_modes = 10;
  optional bool supports_text_input = 20;
  optional bool supports_token_ids_input = 21;
  GenerationCapabilities generation = 22;
  optional bool supports_lora = 23;
  optional bool supports_multimodal = 24;
  string reasoning_parser = 25;
  string tool_call_parser = 26;
  TaskCapabilities tasks = 27;
}

message GenerationCapabilities {
  LogprobCapabilities prompt_logprobs = 1;
  LogprobCapabilities output_logprobs = 2;
  GuidedDecodingCapabilities guided_decoding = 3;
  optional uint32 max_num_sequences = 4;
  optional bool supports_priority = 5;
  optional bool supports_stop_in_output = 6;
  optional bool supports_cache_salt = 7;
  optional bool supports_prefix_cache_bypass = 8;
}

message LogprobCapabilities {
  optional bool supported = 1;
  repeated CandidateTokenSelectionMode candidate_selection_modes = 2;
  optional uint32 max_top_n = 3;
}

enum CandidateTokenSelectionMode {
  CANDIDATE_TOKEN_SELECTION_MODE_UNSPECIFIED = 0;
  CANDIDATE_TOKEN_SELECTION_MODE_TOP_N = 1;
  CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS = 2;
  CANDIDATE_TOKEN_SELECTION_MODE_ALL = 3;
}

message GuidedDecodingCapabilities {
  optional bool supported = 1;
  repeated GuidedDecodingMode modes = 2;
}

enum GuidedDecodingMode {
  GUIDED_DECODING_MODE_UNSPECIFIED = 0;
  GUIDED_DECODING_MODE_JSON_SCHEMA = 1;
  GUIDED_DECODING_MODE_REGEX = 2;
  GUIDED_DECODING_MODE_EBNF_GRAMMAR = 3;
  GUIDED_DECODING_MODE_STRUCTURAL_TAG = 4;
  GUIDED_DECODING_MODE_CHOICE = 5;
  GUIDED_DECODING_MODE_JSON_OBJECT = 6;
}

message TaskRequestContext {
  string request_id = 1;
  string model = 2;
  string lora_name = 3;
  optional int32 priority = 4;
  map<string, string> metadata = 5;
}

message TaskInput {
  string item_id = 1;
  oneof input {
    string text = 2;
    TokenIds token_ids = 3;
    MultimodalTaskInput multimodal = 4;
  }
}

message MultimodalTaskInput {
  oneof prompt {
    string text = 1;
    TokenIds token_ids = 2;
  }
  repeated MediaItem media = 3;
}

message DenseFloatTensor {
  repeated uint64 shape = 1;
  repeated float values = 2;
}

message SparseFloatTensor {
  repeated uint64 shape = 1;
  repeated uint64 indices = 2;
  repeated float values = 3;
}

message TaskUsage {
  uint64 input_tokens = 1;
  optional uint64 cached_input_tokens = 2;
}

enum TaskInputType {
  TASK_INPUT_TYPE_UNSPECIFIED = 0;
  TASK_INPUT_TYPE_TEXT = 1;
  TASK_INPUT_TYPE_TOKEN_IDS = 2;
  TASK_INPUT_TYPE_MULTIMODAL = 3;
}

enum TaskOutputGranularity {
  TASK_OUTPUT_GRANULARITY_UNSPECIFIED = 0;
  TASK_OUTPUT_GRANULARITY_SEQUENCE = 1;
  TASK_OUTPUT_GRANULARITY_TOKEN = 2;
}

enum EmbeddingEncoding {
  EMBEDDING_ENCODING_UNSPECIFIED = 0;
  EMBEDDING_ENCODING_DENSE = 1;
  EMBEDDING_ENCODING_SPARSE = 2;
}

enum TaskValueSemantics {
  TASK_VALUE_SEMANTICS_UNSPECIFIED = 0;
  TASK_VALUE_SEMANTICS_LOGITS = 1;
  TASK_VALUE_SEMANTICS_PROBABILITIES = 2;
  TASK_VALUE_SEMANTICS_LOG_PROBABILITIES = 3;
  TASK_VALUE_SEMANTICS_SIMILARITY = 4;
  TASK_VALUE_SEMANTICS_RELEVANCE = 5;
  TASK_VALUE_SEMANTICS_REWARD = 6;
  TASK_VALUE_SEMANTICS_MODEL_DEFINED = 7;
}

enum ScoreNormalization {
  SCORE_NORMALIZATION_UNSPECIFIED = 0;
  SCORE_NORMALIZATION_NONE = 1;
  SCORE_NORMALIZATION_SOFTMAX = 2;
}

message EmbedRequest {
  TaskRequestContext context = 1;
  repeated TaskInput inputs = 2;
  EmbedOptions options = 3;
}

message EmbedOptions {
  optional TaskOutputGranularity granularity = 1;
  optional bool normalize = 2;
  optional uint32 dimensions = 3;
  optional EmbeddingEncoding encoding = 4;
}

message EmbedResponse {
  string request_id = 1;
  repeated EmbeddingOutput outputs = 2;
  TaskUsage usage = 3;
}

message EmbeddingOutput {
  string item_id = 1;
  optional uint32 input_index = 2;
  TaskOutputGranularity granularity = 3;
  oneof embedding {
    DenseFloatTensor dense = 4;
    SparseFloatTensor sparse = 5;
  }
  repeated uint32 token_ids = 6;
}

message ClassifyRequest {
  TaskRequestContext context = 1;
  repeated TaskInput inputs = 2;
  ClassifyOptions options = 3;
}

message ClassifyOptions {
  optional TaskOutputGranularity granularity = 1;
  optional TaskValueSemantics output_semantics = 2;
}

message ClassifyResponse {
  string request_id = 1;
  repeated ClassificationOutput outputs = 2;
  TaskUsage usage = 3;
}

message ClassificationOutput {
  string item_id = 1;
  optional uint32 input_index = 2;
  TaskOutputGranularity granularity = 3;
  TaskValueSemantics semantics = 4;
  DenseFloatTensor scores = 5;
  repeated string labels = 6;
  repeated uint32 token_ids = 7;
}

message ScoreRequest {
  TaskRequestContext context = 1;
  repeated ScoreGroup groups = 2;
  ScoreOptions options = 3;
}

message ScoreGroup {
  string group_id = 1;
  TaskInput query = 2;
  repeated TaskInput candidates = 3;
}

message ScoreOptions {
  optional TaskOutputGranularity granularity = 1;
  optional TaskValueSemantics output_semantics = 2;
  ScoreNormalization normalization = 3;
  repeated uint32 label_token_ids = 4;
  string instruction = 5;
}

message ScoreResponse {
  string request_id = 1;
  repeated ScoreGroupOutput groups = 2;
  TaskOutputGranularity granularity = 3;
  TaskValueSemantics semantics = 4;
  optional bool higher_is_better = 5;
  ScoreNormalization normalization = 6;
  repeated uint32 label_token_ids = 7;
  TaskUsage usage = 8;
}

message ScoreGroupOutput {
  string group_id = 1;
  optional uint32 group_index = 2;
  repeated ScoreCandidateOutput candidates = 3;
}

message ScoreCandidateOutput {
  string candidate_id = 1;
  optional uint32 candidate_index = 2;
  DenseFloatTensor scores = 3;
  repeated uint32 token_ids = 4;
}

message TaskCapabilities {
  EmbedCapabilities embed = 1;
  ClassifyCapabilities classify = 2;
  ScoreCapabilities score = 3;
}

message EmbedCapabilities {
  optional bool supported = 1;
  repeated TaskInputType input_types = 2;
  repeated TaskOutputGranularity granularities = 3;
  repeated EmbeddingEncoding encodings = 4;
  optional uint32 dimension = 5;
  optional uint32 max_batch_size = 6;
  optional uint64 max_output_values_per_item = 7;
  optional bool supports_priority = 8;
  optional bool supports_lora = 9;
  optional bool supports_normalization = 10;
  optional bool supports_dimension_override = 11;
  repeated Modality modalities = 12;
}

message ClassifyCapabilities {
  optional bool supported = 1;
  repeated TaskInputType input_types = 2;
  repeated TaskOutputGranularity granularities = 3;
  repeated TaskValueSemantics semantics = 4;
  optional uint32 max_batch_size = 5;
  optional uint64 max_output_values_per_item = 6;
  optional bool supports_priority = 7;
  optional bool supports_lora = 8;
  repeated Modality modalities = 9;
}

message ScoreCapabilities {
  optional bool supported = 1;
  repeated TaskInputType input_types = 2;
  repeated TaskOutputGranularity granularities = 3;
  repeated TaskValueSemantics semantics = 4;
  repeated ScoreNormalization normalizations = 5;
  optional bool supports_label_token_scoring = 6;
  optional bool supports_instruction = 7;
  optional uint32 max_groups = 8;
  optional uint32 max_candidates_per_group = 9;
  optional uint64 max_output_values_per_candidate = 10;
  optional bool supports_priority = 11;
  optional bool supports_lora = 12;
  optional bool higher_is_better = 13;
  repeated Modality modalities = 14;
  optional uint32 max_label_token_ids = 15;
}

message LoraAdapter {
  int64 lora_id = 1;
  string lora_name = 2;
  string source_path = 3;
}

message LoadLoraRequest {
  LoraAdapter adapter = 1;
}

message LoadLoraResponse {
  LoraAdapter adapter = 1;
  bool already_loaded = 2;
}

message UnloadLoraRequest {
  string lora_name = 1;
}

message UnloadLoraResponse {
  LoraAdapter adapter = 1;
}

message ListLorasRequest {}

message ListLorasResponse {
  repeated LoraAdapter adapters = 1;
}

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
  optional int32 priority = 12;
  map<string, string> metadata = 13;
}

message TokenIds {
  repeated uint32 ids = 1;
}

message SamplingParams {
  optional double temperature = 1;
  optional double top_p = 2;
  optional int32 top_k = 3;
  optional double min_p = 4;
  optional double frequency_penalty = 5;
  optional double presence_penalty = 6;
  optional double repetition_penalty = 7;
  optional uint64 seed = 8;
  optional uint32 num_sequences = 9;
}

message StoppingOptions {
  optional uint32 max_tokens = 1;
  optional uint32 min_tokens = 2;
  repeated StopCondition conditions = 3;
  optional bool ignore_eos = 4;
  optional bool include_stop_in_output = 5;
}

message ResponseOptions {
  optional bool return_prompt_logprobs = 1;
  CandidateTokenSelection prompt_candidates = 2;
  optional bool return_output_logprobs = 3;
  CandidateTokenSelection output_candidates = 4;
  optional uint32 prompt_logprob_start = 5;
}

message CandidateTokenSelection {
  oneof selection {
    uint32 top_n = 1;
    TokenIds token_ids = 2;
    AllCandidates all = 3;
  }
}

message AllCandidates {}

message KvOptions {
  KvSessionRef session = 1;
  optional uint32 data_parallel_rank = 2;
  optional bool bypass_prefix_cache = 3;
  optional string cache_salt = 4;
}

message StopCondition {
  oneof condition {
    string stop_text = 1;
    uint32 stop_token_id = 2;
  }
}

enum Modality {
  MODALITY_UNSPECIFIED = 0;
  MODALITY_IMAGE = 1;
  MODALITY_VIDEO = 2;
  MODALITY_AUDIO = 3;
}

message MediaItem {
  Modality modality = 1;
  oneof source {
    string url = 2;
    string data_uri = 3;
    bytes raw_bytes = 4;
  }
  string mime_type = 5;
  string uuid = 6;
}

message GuidedDecoding {
  oneof guide {
    string json_schema = 1;
    string regex = 2;
    string ebnf_grammar = 3;
    string structural_tag = 4;
    ChoiceConstraint choice = 5;
    JsonObjectConstraint json_object = 6;
  }
  string backend = 7;
}

message ChoiceConstraint {
  repeated string choices = 1;
}

message JsonObjectConstraint {}

message GenerateResponse {
  string request_id = 1;
  oneof event {
    PromptOutput prompt = 2;
    TokenOutput token = 3;
    PrefillReady prefill_ready = 4;
    GenerationFinished finished = 5;
    EngineError error = 6;
  }
  Usage usage = 10;
}

message PromptOutput {
  repeated TokenInfo tokens = 1;
}

message TokenOutput {
  optional uint32 output_index = 1;
  repeated TokenInfo tokens = 2;
  string text = 3;
}

message TokenInfo {
  uint32 token_id = 1;
  string token = 2;
  optional double logprob = 3;
  optional uint32 rank = 4;
  repeated LogProb candidates = 5;
}

message LogProb {
  uint32 token_id = 1;
  double logprob = 2;
  string token = 3;
  optional uint32 rank = 4;
}

message PrefillReady {
  KvSessionRef kv_session = 1;
}

message GenerationFinished {
  optional uint32 output_index = 1;
  FinishReason reason = 2;
  string message = 3;
  StopMatch stop_match = 4;
}

message StopMatch {
  oneof match {
    uint32 stop_token_id = 1;
    string stop_text = 2;
    uint32 eos_token_id = 3;
  }
}

enum FinishReason {
  FINISH_REASON_UNSPECIFIED = 0;
  FINISH_REASON_STOP = 1;
  FINISH_REASON_LENGTH = 2;
  FINISH_REASON_CANCELLED = 3;
}

message Usage {
  uint32 prompt_tokens = 1;
  uint32 completion_tokens = 2;
  uint32 total_tokens = 3;
  optional uint32 cached_prompt_tokens = 4;
  optional uint32 reasoning_tokens = 5;
}

message KvSessionRef {
  string session_id = 1;
  string transfer_backend = 2;
  repeated KvEndpoint endpoints = 3;
  uint32 dp_rank = 4;
  google.protobuf.Struct attributes_struct = 5;
}

message KvEndpoint {
  string host = 1;
  uint32 port = 2;
  string protocol = 3;
}

message GetKvConnectorInfoRequest {}

message KvConnectorInfo {
  optional bool enabled = 1;
  string transfer_backend = 2;
  repeated KvEndpoint local_endpoints = 3;
  repeated string supported_protocols = 4;
  optional bool supports_remote_prefill = 5;
  optional bool supports_decode_pull = 6;
  optional bool supports_abort_cleanup = 7;
  optional bool supports_drain = 8;
  optional uint32 schema_version = 9;
}

message GetKvEventSourcesRequest {
  repeated uint32 data_parallel_ranks = 1;
}

message GetKvEventSourcesResponse {
  repeated KvEventSource sources = 1;
}

message KvEventSource {
  string transport = 1;
  KvEndpoint endpoint_addr = 2;
  string topic = 3;
  string replay_endpoint = 4;
  optional uint32 data_parallel_rank = 5;
  string encoding = 6;
  optional uint32 schema_version = 7;
  optional uint32 buffer_steps = 8;
  optional uint32 hwm = 9;
  optional uint32 max_queue_size = 10;
}

message SubscribeKvEventsRequest {
  repeated uint32 data_parallel_ranks = 1;
  bool include_snapshot = 2;
  uint64 start_sequence_number = 3;
}

message SubscribeKvEventsResponse {
  oneof event {
    KvEventBatch batch = 1;
    EngineError error = 2;
  }
}

message KvEventBatch {
  uint64 sequence_number = 1;
  uint64 timestamp_unix_nanos = 2;
  uint32 data_parallel_rank = 3;
  repeated KvEvent events = 4;
}

message KvEvent {
  string request_id = 1;
  KvSessionRef kv_session = 2;
  oneof event {
    BlockStored block_stored = 10;
    BlockRemoved block_removed = 11;
    AllBlocksCleared all_blocks_cleared = 12;
  }
}

message BlockStored {
  repeated KvBlockHash block_hashes = 1;
  KvBlockHash parent_block_hash = 2;
  repeated uint32 token_ids = 3;
  uint32 block_size = 4;
  int64 lora_id = 5;
  string lora_name = 6;
  StorageMedium medium = 7;
  repeated OpaqueKeyTuple extra_keys = 20;
  uint32 group_idx = 21;
  string kv_cache_spec_kind = 22;
  uint32 kv_cache_spec_sliding_window = 23;
}

message BlockRemoved {
  repeated KvBlockHash block_hashes = 1;
  StorageMedium medium = 2;
  uint32 group_idx = 3;
}

message AllBlocksCleared {}

message KvBlockHash {
  bytes value = 1;
  string encoding = 2;
}

message OpaqueKeyTuple {
  repeated string values = 1;
}

enum StorageMedium {
  STORAGE_MEDIUM_UNSPECIFIED = 0;
  STORAGE_MEDIUM_GPU = 1;
  STORAGE_MEDIUM_CPU_PINNED = 2;
  STORAGE_MEDIUM_DISK = 3;
  STORAGE_MEDIUM_EXTERNAL = 4;
}

message HealthRequest {
  bool include_inference_probe = 1;
  string model = 2;
  EngineRole role = 3;
}

message HealthResponse {
  HealthState state = 1;
  repeated HealthCheck checks = 2;
}

enum HealthState {
  HEALTH_STATE_UNSPECIFIED = 0;
  HEALTH_STATE_STARTING = 1;
  HEALTH_STATE_READY = 2;
  HEALTH_STATE_DEGRADED = 3;
  HEALTH_STATE_DRAINING = 4;
  HEALTH_STATE_NOT_READY = 5;
}

message HealthCheck {
  string name = 1;
  HealthState state = 2;
  string message = 3;
}

message AbortRequest {
  oneof target {
    string request_id = 1;
    KvSessionRef kv_session = 2;
    AllRequests all_requests = 3;
  }
}

message AllRequests {}

message AbortResponse {
  AbortStatus status = 1;
  string message = 2;
}

enum AbortStatus {
  ABORT_STATUS_UNSPECIFIED = 0;
  ABORT_STATUS_ABORTED = 1;
  ABORT_STATUS_ALREADY_FINISHED = 2;
}

message DrainRequest {
  bool stop_accepting_new_requests = 1;
  optional uint32 deadline_ms = 2;
  bool abort_after_deadline = 3;
}

message DrainResponse {
  oneof event {
    DrainState state = 1;
    EngineError error = 5;
  }
  optional uint32 in_flight_requests = 2;
  optional uint32 open_kv_sessions = 3;
  string message = 4;
}

enum DrainState {
  DRAIN_STATE_UNSPECIFIED = 0;
  DRAIN_STATE_STARTED = 1;
  DRAIN_STATE_IN_PROGRESS = 2;
  DRAIN_STATE_COMPLETE = 3;
}

message GetLoadRequest {
  bool include_per_rank = 1;
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
  map<string, string> attributes = 30;
}

message RankLoadInfo {
  optional uint32 data_parallel_rank = 1;
  optional uint32 running_requests = 2;
  optional uint32 queued_requests = 3;
  optional uint64 used_kv_blocks = 4;
  optional uint64 total_kv_blocks = 5;
  optional uint32 prefill_batch_size = 6;
  optional uint32 decode_batch_size = 7;
}

message SubscribeRuntimeEventsRequest {
  repeated RuntimeEventType types = 1;
}

message SubscribeRuntimeEventsResponse {
  oneof event {
    RuntimeEvent runtime_event = 1;
    EngineError error = 2;
  }
}

enum RuntimeEventType {
  RUNTIME_EVENT_TYPE_UNSPECIFIED = 0;
  RUNTIME_EVENT_TYPE_FORWARD_PASS = 1;
  RUNTIME_EVENT_TYPE_BATCH = 2;
  RUNTIME_EVENT_TYPE_QUEUE = 3;
  RUNTIME_EVENT_TYPE_TRANSFER = 4;
}

message RuntimeEvent {
  string event_id = 1;
  uint64 timestamp_unix_nanos = 2;
  RuntimeEventType type = 3;
  map<string, string> attributes = 4;
}

message EngineError {
  ErrorCode code = 1;
  string message = 2;
  bool retryable = 3;
  optional uint64 retry_after_ms = 4;
  google.protobuf.Struct details = 5;
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
  ERROR_CODE_DRAINING = 11;
  ERROR_CODE_INTERNAL = 12;
}
"""

FILES: dict[str, set[str]] = {
    "classification.proto": {
        "ClassificationOutput",
        "ClassifyCapabilities",
        "ClassifyOptions",
        "ClassifyRequest",
        "ClassifyResponse",
    },
    "embedding.proto": {
        "EmbedCapabilities",
        "EmbedOptions",
        "EmbedRequest",
        "EmbedResponse",
        "EmbeddingEncoding",
        "EmbeddingOutput",
        "SparseFloatTensor",
    },
    "engine.proto": {"EngineInfo", "EngineRole", "GetEngineInfoRequest", "ParallelismInfo"},
    "error.proto": {"EngineError", "ErrorCode"},
    "generation.proto": {
        "AllCandidates",
        "CandidateTokenSelection",
        "ChoiceConstraint",
        "FinishReason",
        "GenerateRequest",
        "GenerateResponse",
        "GenerationFinished",
        "GuidedDecoding",
        "JsonObjectConstraint",
        "KvOptions",
        "LogProb",
        "PrefillReady",
        "PromptOutput",
        "ResponseOptions",
        "SamplingParams",
        "StopCondition",
        "StopMatch",
        "StoppingOptions",
        "TokenInfo",
        "TokenOutput",
        "Usage",
    },
    "input.proto": {"MediaItem", "Modality", "MultimodalTaskInput", "TaskInput", "TaskInputType", "TokenIds"},
    "kv.proto": {
        "AllBlocksCleared",
        "BlockRemoved",
        "BlockStored",
        "GetKvConnectorInfoRequest",
        "GetKvEventSourcesRequest",
        "GetKvEventSourcesResponse",
        "KvBlockHash",
        "KvConnectorInfo",
        "KvEndpoint",
        "KvEvent",
        "KvEventBatch",
        "KvEventSource",
        "KvSessionRef",
        "OpaqueKeyTuple",
        "StorageMedium",
        "SubscribeKvEventsRequest",
        "SubscribeKvEventsResponse",
    },
    "lifecycle.proto": {
        "AbortRequest",
        "AbortResponse",
        "AbortStatus",
        "AllRequests",
        "DrainRequest",
        "DrainResponse",
        "DrainState",
        "HealthCheck",
        "HealthRequest",
        "HealthResponse",
        "HealthState",
    },
    "lora.proto": {
        "ListLorasRequest",
        "ListLorasResponse",
        "LoadLoraRequest",
        "LoadLoraResponse",
        "LoraAdapter",
        "UnloadLoraRequest",
        "UnloadLoraResponse",
    },
    "model.proto": {
        "CandidateTokenSelectionMode",
        "GenerationCapabilities",
        "GetModelInfoRequest",
        "GuidedDecodingCapabilities",
        "GuidedDecodingMode",
        "LogprobCapabilities",
        "ModelInfo",
        "TaskCapabilities",
    },
    "observability.proto": {
        "GetLoadRequest",
        "LoadInfo",
        "RankLoadInfo",
        "RuntimeEvent",
        "RuntimeEventType",
        "SubscribeRuntimeEventsRequest",
        "SubscribeRuntimeEventsResponse",
    },
    "openengine.proto": set(),
    "scoring.proto": {
        "ScoreCandidateOutput",
        "ScoreCapabilities",
        "ScoreGroup",
        "ScoreGroupOutput",
        "ScoreNormalization",
        "ScoreOptions",
        "ScoreRequest",
        "ScoreResponse",
    },
    "tasks.proto": {
        "DenseFloatTensor",
        "TaskOutputGranularity",
        "TaskRequestContext",
        "TaskUsage",
        "TaskValueSemantics",
    },
}
"""Which top-level message or enum each of the 14 schema files defines."""

STRUCT_PROTO = "google/protobuf/struct.proto"
STRUCT_IMPORTERS = {"error.proto", "kv.proto"}

RPCS = [
    # name, request, response, server-streaming
    ("Generate", "GenerateRequest", "GenerateResponse", True),
    ("Embed", "EmbedRequest", "EmbedResponse", False),
    ("Classify", "ClassifyRequest", "ClassifyResponse", False),
    ("Score", "ScoreRequest", "ScoreResponse", False),
    ("GetEngineInfo", "GetEngineInfoRequest", "EngineInfo", False),
    ("GetModelInfo", "GetModelInfoRequest", "ModelInfo", False),
    ("GetLoad", "GetLoadRequest", "LoadInfo", False),
    ("Health", "HealthRequest", "HealthResponse", False),
    ("Abort", "AbortRequest", "AbortResponse", False),
    ("Drain", "DrainRequest", "DrainResponse", True),
    ("LoadLora", "LoadLoraRequest", "LoadLoraResponse", False),
    ("UnloadLora", "UnloadLoraRequest", "UnloadLoraResponse", False),
    ("ListLoras", "ListLorasRequest", "ListLorasResponse", False),
    ("GetKvConnectorInfo", "GetKvConnectorInfoRequest", "KvConnectorInfo", False),
    ("GetKvEventSources", "GetKvEventSourcesRequest", "GetKvEventSourcesResponse", False),
    ("SubscribeKvEvents", "SubscribeKvEventsRequest", "SubscribeKvEventsResponse", True),
    ("SubscribeRuntimeEvents", "SubscribeRuntimeEventsRequest", "SubscribeRuntimeEventsResponse", True),
]

# -- rendering both sides in one notation --------------------------------------------------

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}

Rendered = dict[str, tuple[str, list[str]]]
"""Type name -> ("message" | "enum", its fields or values, one canonical line each)."""


@functools.cache
def parse_spec(text: str) -> Rendered:
    """The spec's blocks as canonical lines: ``[label ]type name = N``, oneof members prefixed."""
    result: Rendered = {}
    kind = name = oneof = None
    lines: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        opened = re.fullmatch(r"(message|enum) (\w+) \{(\})?", line)
        if opened:
            kind, name, lines = opened.group(1), opened.group(2), []
            if opened.group(3):
                result[name] = (kind, lines)
                kind = name = None
            continue
        if line.startswith("oneof "):
            oneof = line.split()[1]
            continue
        if line == "}":
            if oneof is not None:
                oneof = None
                continue
            assert kind is not None and name is not None
            result[name] = (kind, lines)
            kind = name = None
            continue
        entry = " ".join(line.rstrip(";").replace(", ", ",").split())
        lines.append(f"oneof {oneof}: {entry}" if oneof else entry)
    return result


def _type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    prefix = f".{PACKAGE}."
    return field.type_name[len(prefix) :] if field.type_name.startswith(prefix) else field.type_name.lstrip(".")


def render_file(proto: descriptor_pb2.FileDescriptorProto) -> Rendered:
    """A file's top-level messages and enums in the spec notation."""
    result: Rendered = {}
    for enum in proto.enum_type:
        result[enum.name] = ("enum", [f"{v.name} = {v.number}" for v in enum.value])
    for message in proto.message_type:
        maps = {nested.name: nested for nested in message.nested_type if nested.options.map_entry}
        lines = []
        for field in message.field:
            label = ""
            if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
                entry = maps.get(field.type_name.rsplit(".", 1)[-1])
                if entry is not None:
                    key, value = entry.field
                    lines.append(f"map<{_type_name(key)},{_type_name(value)}> {field.name} = {field.number}")
                    continue
                label = "repeated "
            elif field.proto3_optional:
                label = "optional "
            line = f"{label}{_type_name(field)} {field.name} = {field.number}"
            if field.HasField("oneof_index") and not field.proto3_optional:
                line = f"oneof {message.oneof_decl[field.oneof_index].name}: {line}"
            lines.append(line)
        result[message.name] = ("message", lines)
    return result


def _file_proto(name: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.SERVICE_DESCRIPTOR.file.pool.FindFileByName(f"openengine/v1/{name}").CopyToProto(proto)
    return proto


@functools.cache
def _generated_schema() -> Rendered:
    schema: Rendered = {}
    for name in FILES:
        schema.update(render_file(_file_proto(name)))
    return schema


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_proto", ROOT / "scripts" / "generate_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- generated code is fresh -----------------------------------------------------------------


def test_generated_code_is_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"regenerate with scripts/generate_proto.py:\n{result.stderr}"


def test_stale_check_detects_an_edited_module(tmp_path: Path) -> None:
    """The staleness check can fail: an edited, missing or extra generated file is reported."""
    script = _load_script()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    script.generate(fresh)
    committed = tmp_path / "committed"
    shutil.copytree(fresh, committed)
    assert script.stale_files(fresh, committed) == []
    target = committed / "openengine" / "v1" / "generation_pb2.py"
    target.write_text(target.read_text() + "\n# edited\n")
    (committed / "openengine" / "v1" / "engine_pb2.pyi").unlink()
    (committed / "openengine" / "v1" / "extra_pb2.py").write_text("")
    assert script.stale_files(fresh, committed) == [
        "openengine/v1/engine_pb2.pyi",
        "openengine/v1/extra_pb2.py",
        "openengine/v1/generation_pb2.py",
    ]


def test_generated_modules_import_relatively() -> None:
    """Generated code never claims a top-level ``openengine`` or ``openengine_gateway`` package."""
    modules = [*GENERATED_DIR.glob("*.py*"), *ROUTES_GENERATED_DIR.glob("*.py*")]
    assert {module.name for module in ROUTES_GENERATED_DIR.glob("*.py*")} >= {"routes_pb2.py", "routes_pb2_grpc.py"}
    for module in modules:
        assert not re.search(r"^(from|import) openengine(_gateway)?\b", module.read_text(), re.M), module.name


def test_the_gateways_own_service_is_in_a_package_of_its_own() -> None:
    """``openengine_gateway.v1.Routes`` adds nothing to the contract's package and uses none of its types."""
    service = routes_pb.SERVICE_DESCRIPTOR
    assert service.full_name == routes_pb.SERVICE_NAME == "openengine_gateway.v1.Routes"
    assert service.file.name == "openengine_gateway/v1/routes.proto" and not service.file.dependencies
    assert [method.name for method in service.methods] == ["GetRoutes", "ReloadRoutes", "ControlCanary"]


# -- files ------------------------------------------------------------------------------------


def test_the_fourteen_schema_files() -> None:
    assert sorted(p.name for p in PROTO_DIR.glob("*.proto")) == sorted(FILES)
    assert len(FILES) == 14
    for name in FILES:
        stem = name.removesuffix(".proto")
        assert (GENERATED_DIR / f"{stem}_pb2.py").is_file()
        assert (GENERATED_DIR / f"{stem}_pb2.pyi").is_file()
    assert sorted(p.name for p in GENERATED_DIR.glob("*_pb2_grpc.py")) == ["openengine_pb2_grpc.py"]


@pytest.mark.parametrize("name", sorted(FILES))
def test_file_contents_and_options(name: str) -> None:
    """Each file defines exactly its types, in package openengine.v1, proto3, with no file options."""
    proto = _file_proto(name)
    assert proto.package == PACKAGE
    assert proto.syntax == "proto3"
    assert not proto.HasField("options"), f"{name} sets file options: {proto.options}"
    assert {m.name for m in proto.message_type} | {e.name for e in proto.enum_type} == FILES[name]
    assert (STRUCT_PROTO in proto.dependency) == (name in STRUCT_IMPORTERS)
    for dependency in proto.dependency:
        assert dependency == STRUCT_PROTO or dependency.startswith("openengine/v1/")


def test_every_spec_type_is_defined_once() -> None:
    spec = parse_spec(SPEC_SCHEMA)
    declared = [name for names in FILES.values() for name in names]
    assert len(declared) == len(set(declared))
    assert set(declared) == set(spec)


def test_no_nested_types_besides_map_entries() -> None:
    for name in FILES:
        for message in _file_proto(name).message_type:
            assert not message.enum_type, message.name
            assert all(nested.options.map_entry for nested in message.nested_type), message.name


# -- the service -------------------------------------------------------------------------------


def test_service_rpcs() -> None:
    service = pb.SERVICE_DESCRIPTOR
    assert service.full_name == pb.SERVICE_NAME == "openengine.v1.OpenEngine"
    assert service.file.name == "openengine/v1/openengine.proto"
    actual = [
        (m.name, m.input_type.full_name, m.output_type.full_name, m.server_streaming, m.client_streaming)
        for m in service.methods
    ]
    expected = [(n, f"{PACKAGE}.{req}", f"{PACKAGE}.{res}", streaming, False) for n, req, res, streaming in RPCS]
    assert actual == expected
    assert len(actual) == 17


def test_service_is_registered_for_reflection() -> None:
    """Importing the facade registers openengine.proto, so reflection can describe the service."""
    from google.protobuf import descriptor_pool

    found = descriptor_pool.Default().FindFileContainingSymbol(pb.SERVICE_NAME)
    assert found.name == "openengine/v1/openengine.proto"


def test_stub_and_servicer_cover_every_rpc() -> None:
    names = [name for name, *_ in RPCS]
    assert all(callable(getattr(pb.OpenEngineServicer, name)) for name in names)


# -- messages and enums -----------------------------------------------------------------------


@pytest.mark.parametrize("type_name", sorted(parse_spec(SPEC_SCHEMA)))
def test_type_matches_spec(type_name: str) -> None:
    """Field numbers, labels (optional, repeated, map), types and oneofs, or enum values."""
    expected = parse_spec(SPEC_SCHEMA)[type_name]
    actual = _generated_schema()[type_name]
    assert actual == expected


def test_spec_parser_reads_every_construct() -> None:
    """The notation the comparisons rely on: optional, repeated, map, oneof and enum values."""
    parsed = parse_spec(SPEC_SCHEMA)
    assert parsed["GetEngineInfoRequest"] == ("message", [])
    request = parsed["GenerateRequest"][1]
    assert "oneof input: string prompt = 3" in request
    assert "oneof input: TokenIds token_ids = 4" in request
    assert "repeated MediaItem media = 10" in request
    assert "optional int32 priority = 12" in request
    assert "map<string,string> metadata = 13" in request
    assert parsed["FinishReason"] == (
        "enum",
        [
            "FINISH_REASON_UNSPECIFIED = 0",
            "FINISH_REASON_STOP = 1",
            "FINISH_REASON_LENGTH = 2",
            "FINISH_REASON_CANCELLED = 3",
        ],
    )
    assert "google.protobuf.Struct attributes_struct = 5" in parsed["KvSessionRef"][1]


def test_presence_survives_the_wire() -> None:
    """A present zero is distinguishable from absent after a round trip (optional scalars)."""
    sent = pb.ModelInfo(max_context_length=0, supports_lora=False)
    received = pb.ModelInfo.FromString(sent.SerializeToString())
    assert received.HasField("max_context_length") and received.HasField("supports_lora")
    assert not received.HasField("max_output_tokens")
    output = pb.TokenOutput.FromString(pb.TokenOutput(output_index=0).SerializeToString())
    assert output.HasField("output_index")


def test_schema_release_constants() -> None:
    assert pb.SCHEMA_REVISION == 1
    assert pb.MINIMUM_CLIENT_REVISION == 1
    assert pb.SCHEMA_RELEASE == "d0f29fec31f31db5cfd49cf3e0f67da84d10c709"


def test_facade_reexports_every_message_and_enum() -> None:
    """``pb`` is the one import point: every generated type and enum constant is reachable."""
    for name in FILES:
        proto = _file_proto(name)
        for message in proto.message_type:
            assert getattr(pb, message.name).DESCRIPTOR.full_name == f"{PACKAGE}.{message.name}"
        for enum in proto.enum_type:
            assert getattr(pb, enum.name).DESCRIPTOR.full_name == f"{PACKAGE}.{enum.name}"
            for value in enum.value:
                assert getattr(pb, value.name) == value.number
    assert pb.Struct.DESCRIPTOR.full_name == "google.protobuf.Struct"
    assert callable(pb.OpenEngineStub) and callable(pb.add_OpenEngineServicer_to_server)
