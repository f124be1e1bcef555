"""Wire messages -> SPI values: pure functions, no I/O, for a driver whose engine speaks OpenEngine.

The ``remote`` driver reads another gateway's answers with them, and the compatibility layer
(``openengine_gateway.compat``) reads a revision-1 driver's wire-message results. Every value
survives, presence included (an absent field is ``None``), so the core encodes the same
messages again. Tensor values and repeated fields are the message's own containers, not copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from .. import pb
from ..errors import Internal
from .kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent, KvEventBatch, KvEventSource
from .requests import Endpoint, KvSession
from .results import (
    CandidateScore,
    Classification,
    DenseTensor,
    Embedding,
    HealthCheck,
    Load,
    RankLoad,
    ScoreResult,
    SparseTensor,
    TaskUsage,
)

LOAD_SCALARS = tuple(f.name for f in fields(Load) if f.name not in ("ranks", "attributes"))
"""``Load``'s optional numbers, named as ``LoadInfo``'s fields (read here, encoded by the core)."""
RANK_SCALARS = tuple(f.name for f in fields(RankLoad))
"""``RankLoad``'s fields, named as ``RankLoadInfo``'s."""


def dense(tensor: pb.DenseFloatTensor) -> DenseTensor:
    """A received dense tensor."""
    return DenseTensor(shape=tensor.shape, values=tensor.values)


def usage(message: pb.TaskUsage) -> TaskUsage:
    """The remote's task usage; unknown cached tokens stay unknown."""
    cached = message.cached_input_tokens if message.HasField("cached_input_tokens") else None
    return TaskUsage(message.input_tokens, cached)


def embeddings(outputs: Sequence[pb.EmbeddingOutput]) -> list[Embedding]:
    """The remote's embeddings, in order; one without a vector is a malformed result."""
    results = []
    for index, output in enumerate(outputs):
        vector: DenseTensor | SparseTensor
        kind = output.WhichOneof("embedding")
        if kind == "dense":
            vector = dense(output.dense)
        elif kind == "sparse":
            vector = SparseTensor(shape=output.sparse.shape, indices=output.sparse.indices, values=output.sparse.values)
        else:
            raise Internal(f"the engine returned a malformed result: outputs[{index}]: no embedding")
        results.append(Embedding(output.granularity, vector, token_ids=output.token_ids))
    return results


def classifications(outputs: Sequence[pb.ClassificationOutput]) -> list[Classification]:
    """The remote's classifications, in order."""
    return [
        Classification(output.granularity, output.semantics, dense(output.scores), output.labels, output.token_ids)
        for output in outputs
    ]


def score_result(response: pb.ScoreResponse) -> ScoreResult:
    """The remote's groups and candidates with the semantics it reported."""
    groups = [
        [CandidateScore(dense(candidate.scores), candidate.token_ids) for candidate in group.candidates]
        for group in response.groups
    ]
    higher = response.higher_is_better if response.HasField("higher_is_better") else None
    return ScoreResult(response.granularity, response.semantics, response.normalization, groups, higher)


def load(message: pb.LoadInfo) -> Load:
    """The remote's load snapshot (its instance id is the front's to set)."""
    ranks = [RankLoad(**_present(rank, RANK_SCALARS)) for rank in message.ranks]
    return Load(**_present(message, LOAD_SCALARS), ranks=ranks, attributes=dict(message.attributes))


def _present(message: Message, names: Sequence[str]) -> dict[str, int]:
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def health_checks(checks: Sequence[pb.HealthCheck]) -> list[HealthCheck]:
    """The remote's checks as they are."""
    return [HealthCheck(check.name, check.state, check.message) for check in checks]


def kv_session(ref: pb.KvSessionRef) -> KvSession:
    """The SPI value of the remote's ``KvSessionRef`` (attributes keep their JSON types)."""
    return KvSession(
        session_id=ref.session_id,
        transfer_backend=ref.transfer_backend,
        endpoints=tuple(Endpoint(e.host, e.port, e.protocol) for e in ref.endpoints),
        dp_rank=ref.dp_rank,
        attributes=MessageToDict(ref.attributes_struct) if ref.HasField("attributes_struct") else {},
    )


def kv_batch(batch: pb.KvEventBatch) -> KvEventBatch:
    """A received batch, numbers and rank as the remote sent them."""
    return KvEventBatch(
        events=[event for event in map(kv_event, batch.events) if event is not None],
        data_parallel_rank=batch.data_parallel_rank,
        sequence_number=batch.sequence_number,
        timestamp_unix_nanos=batch.timestamp_unix_nanos,
    )


def kv_event(event: pb.KvEvent) -> KvEvent | None:
    """One received event, or None for one without a kind."""
    session = kv_session(event.kv_session) if event.HasField("kv_session") else None
    kind = event.WhichOneof("event")
    if kind == "block_stored":
        stored = event.block_stored
        return BlockStored(
            block_hashes=_hashes(stored.block_hashes),
            token_ids=stored.token_ids,
            parent_block_hash=_hash(stored.parent_block_hash) if stored.HasField("parent_block_hash") else None,
            block_size=stored.block_size,
            lora_id=stored.lora_id,
            lora_name=stored.lora_name,
            medium=stored.medium,
            extra_keys=[keys.values for keys in stored.extra_keys],
            group_idx=stored.group_idx,
            kv_cache_spec_kind=stored.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=stored.kv_cache_spec_sliding_window,
            request_id=event.request_id,
            kv_session=session,
        )
    if kind == "block_removed":
        removed = event.block_removed
        return BlockRemoved(
            block_hashes=_hashes(removed.block_hashes),
            medium=removed.medium,
            group_idx=removed.group_idx,
            request_id=event.request_id,
            kv_session=session,
        )
    if kind == "all_blocks_cleared":
        return AllBlocksCleared(request_id=event.request_id, kv_session=session)
    return None


def _hash(value: pb.KvBlockHash) -> BlockHash:
    return BlockHash(value.value, value.encoding)


def _hashes(values: Iterable[pb.KvBlockHash]) -> list[BlockHash]:
    return [_hash(value) for value in values]


def kv_source(source: pb.KvEventSource) -> KvEventSource:
    """A publisher the remote listed (``GetKvEventSources``), unset optional fields as None."""
    address = source.endpoint_addr
    return KvEventSource(
        transport=source.transport,
        endpoint=Endpoint(address.host, address.port, address.protocol) if source.HasField("endpoint_addr") else None,
        topic=source.topic,
        replay_endpoint=source.replay_endpoint,
        data_parallel_rank=source.data_parallel_rank if source.HasField("data_parallel_rank") else None,
        encoding=source.encoding,
        schema_version=source.schema_version if source.HasField("schema_version") else None,
        buffer_steps=source.buffer_steps if source.HasField("buffer_steps") else None,
        hwm=source.hwm if source.HasField("hwm") else None,
        max_queue_size=source.max_queue_size if source.HasField("max_queue_size") else None,
    )


__all__ = [
    "LOAD_SCALARS",
    "RANK_SCALARS",
    "classifications",
    "dense",
    "embeddings",
    "health_checks",
    "kv_batch",
    "kv_event",
    "kv_session",
    "kv_source",
    "load",
    "score_result",
    "usage",
]
