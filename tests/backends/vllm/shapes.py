"""Stand-ins with the exact shapes vLLM 0.32 defines, so mapping tests need no vLLM.

Each mirrors the attribute names and meanings in vLLM's source: ``vllm.logprobs``
(``Logprob``, ``FlatLogprobs``), ``vllm.outputs`` (``CompletionOutput``, ``RequestOutput``),
``vllm.v1.metrics.stats.SchedulerStats``, ``vllm.config.kv_events.KVEventsConfig`` and the
config objects of ``VllmConfig`` the driver reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Entry = tuple[int, float, int | None, str | None]


@dataclass
class Logprob:
    """``vllm.logprobs.Logprob``."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """``vllm.logprobs.FlatLogprobs``: positions as ranges over parallel lists."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def append_row(self, row: list[Entry] | None) -> None:
        """As vLLM's ``append_fast``: entries kept as given, duplicates included."""
        self.start_indices.append(len(self.logprobs))
        for token_id, logprob, rank, text in row or ():
            self.token_ids.append(token_id)
            self.logprobs.append(logprob)
            self.ranks.append(rank)
            self.decoded_tokens.append(text)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)


def flat(*rows: list[Entry] | None) -> FlatLogprobs:
    """``FlatLogprobs`` of positions given as entry rows: chosen token first, then candidates
    (a chosen token that is also a top candidate appears twice, as in vLLM)."""
    result = FlatLogprobs()
    for row in rows:
        result.append_row(row)
    return result


def as_dicts(*rows: list[Entry] | None) -> list[dict[int, Logprob] | None]:
    """The same positions in vLLM's list-of-dicts form (a duplicate id collapses into one)."""
    return [None if row is None else {t: Logprob(lp, rank, text) for t, lp, rank, text in row} for row in rows]


@dataclass
class CompletionOutput:
    """``vllm.outputs.CompletionOutput`` (DELTA: new ids, text and logprob positions only)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """``vllm.outputs.RequestOutput``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None = 0
    prompt_token_id_logprobs: Any = None
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class SchedulerStats:
    """``vllm.v1.metrics.stats.SchedulerStats`` (the fields the driver reads)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


@dataclass
class KVEventsConfig:
    """``vllm.config.kv_events.KVEventsConfig`` as the publisher resolved it."""

    enable_kv_cache_events: bool = True
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""


@dataclass
class ModelConfig:
    model: str = "/models/tiny"
    max_model_len: int = 512
    max_logprobs: int = 20
    tokenizer_mode: str = "auto"
    is_multimodal_model: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int | None = 1000


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    policy: str = "fcfs"


@dataclass
class StructuredOutputsConfig:
    backend: str = "auto"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    kv_role: str | None = None


@dataclass
class VllmConfig:
    """The parts of ``vllm.config.VllmConfig`` the driver reads after the engine started."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: KVTransferConfig | None = None
    lora_config: object | None = None


__all__ = [
    "CacheConfig",
    "CompletionOutput",
    "Entry",
    "FlatLogprobs",
    "KVEventsConfig",
    "KVTransferConfig",
    "Logprob",
    "ModelConfig",
    "ParallelConfig",
    "RequestOutput",
    "SchedulerConfig",
    "SchedulerStats",
    "StructuredOutputsConfig",
    "VllmConfig",
    "as_dicts",
    "flat",
]
