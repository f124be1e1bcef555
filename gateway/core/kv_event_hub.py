"""KV cache events: sequencing, replay, snapshots and bounded fan-out.

Every engine's KV event batches pass through one ``KvEventHub``. Per data-parallel rank it

* keeps sequence numbers strictly increasing: an engine's own numbers are kept while they
  increase; a batch without one (zero) gets the next number; a number that goes backwards
  (the engine restarted its publisher) is shifted past the last one delivered;
* never papers over a gap: an engine number that skips ahead of the engine's previous one
  means batches were lost (a driver repairs what its engine can replay first; an engine's
  first number only sets where it starts), so the affected subscribers end with a
  terminal retryable ``ERROR_CODE_INTERNAL`` whose details name the missing range, and
  replay restarts after it; resubscribing with a snapshot gets the stored blocks as the
  received events left them;
* retains the last ``replay_batches`` batches for ``start_sequence_number`` replay;
* maintains the set of blocks currently stored (from the events themselves), so a
  subscriber can start from a snapshot instead of a replay;
* delivers to each subscriber through a bounded queue: one that falls behind ends with a
  terminal retryable ``ERROR_CODE_OVERLOADED`` whose details say where to resume.

``include_snapshot`` takes precedence over ``start_sequence_number``: the snapshot batch
carries the sequence number of the last batch it reflects, and live batches follow it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from .. import pb
from ..errors import EngineFailure, InvalidArgument, OutOfRange
from .fanout import Subscriber

log = logging.getLogger(__name__)

_BlockKey = tuple[int, int, bytes]  # (medium, group_idx, hash bytes)


@dataclass(slots=True)
class _Rank:
    """Sequencing, replay and stored-block state of one data-parallel rank."""

    replay: deque[pb.KvEventBatch]
    last_sequence: int = 0
    numbered: bool = False
    """Whether the last batch carried the engine's own number (only then can the next one skip)."""
    offset: int = 0
    evicted_through: int = 0
    stored: OrderedDict[_BlockKey, pb.KvEvent] = field(default_factory=OrderedDict)


@dataclass(slots=True, eq=False)
class _Subscription:
    queue: Subscriber[pb.SubscribeKvEventsResponse]
    ranks: frozenset[int] | None
    start_sequence: int
    delivered: dict[int, int] = field(default_factory=dict)


class KvEventHub:
    """Sequencing, replay, snapshot and fan-out for one gateway's KV events."""

    def __init__(
        self, ranks: Iterable[int] = (0,), *, replay_batches: int = 4096, subscriber_queue: int = 1024
    ) -> None:
        self._replay_batches = replay_batches
        self._subscriber_queue = subscriber_queue
        self._ranks: dict[int, _Rank] = {r: _Rank(deque(maxlen=replay_batches)) for r in ranks}
        self._subscriptions: set[_Subscription] = set()
        self.dropped_subscribers = 0
        """Subscriptions ended for falling behind."""
        self.gaps = 0
        """Gaps in an engine's sequence numbers reported to subscribers."""

    @property
    def subscriber_count(self) -> int:
        """Subscriptions currently open."""
        return len(self._subscriptions)

    @property
    def ranks(self) -> list[int]:
        """The data-parallel ranks this hub knows."""
        return sorted(self._ranks)

    def publish(self, batch: pb.KvEventBatch) -> None:
        """Sequence, retain, apply and deliver one batch (the hub takes ownership of it)."""
        rank = self._ranks.get(batch.data_parallel_rank)
        if rank is None:
            rank = self._ranks[batch.data_parallel_rank] = _Rank(deque(maxlen=self._replay_batches))
        number = batch.sequence_number
        if number == 0:
            number = rank.last_sequence + 1
        else:
            number += rank.offset
            if number <= rank.last_sequence:
                rank.offset += rank.last_sequence + 1 - number
                number = rank.last_sequence + 1
            elif number > rank.last_sequence + 1 and rank.numbered:
                self._gap(batch.data_parallel_rank, rank, number)
        rank.numbered = batch.sequence_number != 0
        batch.sequence_number = number
        rank.last_sequence = number
        if not batch.timestamp_unix_nanos:
            batch.timestamp_unix_nanos = time.time_ns()
        if len(rank.replay) == rank.replay.maxlen:
            rank.evicted_through = rank.replay[0].sequence_number
        rank.replay.append(batch)
        _apply(rank.stored, batch)
        response = pb.SubscribeKvEventsResponse(batch=batch)
        for subscription in list(self._subscriptions):
            if subscription.ranks is not None and batch.data_parallel_rank not in subscription.ranks:
                continue
            if number < subscription.start_sequence:
                continue
            if subscription.queue.offer(response):
                subscription.delivered[batch.data_parallel_rank] = number
            elif subscription.queue.overflowed:
                self._subscriptions.discard(subscription)
                self.dropped_subscribers += 1

    def subscribe(
        self, ranks: Iterable[int], *, include_snapshot: bool, start_sequence_number: int
    ) -> Subscriber[pb.SubscribeKvEventsResponse]:
        """Open a subscription (validated before acceptance); iterate the result.

        Raises ``InvalidArgument`` for an unknown rank and ``OutOfRange`` for a replay start
        that was already evicted.
        """
        wanted = frozenset(ranks) or None
        if wanted is not None:
            unknown = sorted(wanted - self._ranks.keys())
            if unknown:
                raise InvalidArgument(f"unknown data_parallel_ranks {unknown}; this server has {self.ranks}")
        selected = sorted(wanted) if wanted is not None else self.ranks
        subscription = _Subscription(
            queue=None,  # type: ignore[arg-type]  # set below, after the closure exists
            ranks=wanted,
            start_sequence=0 if include_snapshot else start_sequence_number,
        )
        subscription.queue = Subscriber(self._subscriber_queue, lambda: _overflow(subscription))
        if include_snapshot:
            for number in selected:
                rank = self._ranks[number]
                snapshot = pb.KvEventBatch(
                    sequence_number=rank.last_sequence,
                    timestamp_unix_nanos=time.time_ns(),
                    data_parallel_rank=number,
                    events=rank.stored.values(),
                )
                subscription.queue.offer(pb.SubscribeKvEventsResponse(batch=snapshot))
                subscription.delivered[number] = rank.last_sequence
        elif start_sequence_number:
            replay: list[pb.SubscribeKvEventsResponse] = []
            for number in selected:
                rank = self._ranks[number]
                if start_sequence_number <= rank.evicted_through:
                    raise OutOfRange(
                        f"rank {number} no longer retains sequence {start_sequence_number} (oldest is "
                        f"{rank.evicted_through + 1}); resubscribe with include_snapshot"
                    )
                for batch in rank.replay:
                    if batch.sequence_number >= start_sequence_number:
                        replay.append(pb.SubscribeKvEventsResponse(batch=batch))
                        subscription.delivered[number] = batch.sequence_number
            subscription.queue.preload(replay)  # all that is retained, however long: the queue bounds what follows
        self._subscriptions.add(subscription)
        return subscription.queue

    def _gap(self, number: int, rank: _Rank, arrived: int) -> None:
        """Batches ``rank.last_sequence + 1 .. arrived - 1`` are lost: end who needed them."""
        first, last = rank.last_sequence + 1, arrived - 1
        self.gaps += 1
        rank.replay.clear()
        rank.evicted_through = last
        log.warning("KV event batches %d..%d of rank %d were lost by the engine's publisher", first, last, number)
        message = (
            f"the engine's publisher lost KV event batches {first}..{last} of rank {number}; "
            "resubscribe with include_snapshot"
        )
        details = {"reason": "kv_event_gap", "data_parallel_rank": number, "missing_from": first, "missing_to": last}
        # The unchanged request succeeds again only without a replay start: one within the lost
        # range is now evicted (OUT_OF_RANGE), so for it the error is not retryable.
        live, replaying = (
            pb.SubscribeKvEventsResponse(
                error=EngineFailure(
                    pb.ERROR_CODE_INTERNAL,
                    message,
                    retryable=retryable,
                    retry_after_ms=0 if retryable else None,
                    details=details,
                ).to_proto()
            )
            for retryable in (True, False)
        )
        for subscription in list(self._subscriptions):
            if subscription.ranks is not None and number not in subscription.ranks:
                continue
            if last < subscription.start_sequence:
                continue
            subscription.queue.close(replaying if subscription.start_sequence else live)
            self._subscriptions.discard(subscription)

    def unsubscribe(self, queue: Subscriber[pb.SubscribeKvEventsResponse]) -> None:
        """Forget a subscription whose client went away."""
        self._subscriptions = {s for s in self._subscriptions if s.queue is not queue}

    def close(self, failure: EngineFailure) -> None:
        """End every subscription with ``failure`` (the gateway is stopping)."""
        for subscription in self._subscriptions:
            subscription.queue.close(pb.SubscribeKvEventsResponse(error=failure.to_proto()))
        self._subscriptions.clear()


def _overflow(subscription: _Subscription) -> pb.SubscribeKvEventsResponse:
    """The terminal error for a subscriber that fell behind, with where to resume."""
    resume = {str(rank): number + 1 for rank, number in subscription.delivered.items()}
    failure = EngineFailure(
        pb.ERROR_CODE_OVERLOADED,
        "subscriber fell behind the KV event stream; resubscribe from the next sequence number per rank",
        retryable=True,
        retry_after_ms=0,
        details={"resume_sequence_numbers": resume},
    )
    return pb.SubscribeKvEventsResponse(error=failure.to_proto())


def _apply(stored: OrderedDict[_BlockKey, pb.KvEvent], batch: pb.KvEventBatch) -> None:
    """Update the stored-block set with one batch's events."""
    for event in batch.events:
        kind = event.WhichOneof("event")
        if kind == "block_stored":
            _store(stored, event)
        elif kind == "block_removed":
            removed = event.block_removed
            for block_hash in removed.block_hashes:
                stored.pop((removed.medium, removed.group_idx, block_hash.value), None)
        elif kind == "all_blocks_cleared":
            stored.clear()


def _store(stored: OrderedDict[_BlockKey, pb.KvEvent], event: pb.KvEvent) -> None:
    """Record each block of a BlockStored event as its own single-block event."""
    source = event.block_stored
    hashes = list(source.block_hashes)
    size = source.block_size
    tokens = list(source.token_ids)
    per_block = size if size and len(tokens) == size * len(hashes) else 0
    parent = source.parent_block_hash if source.HasField("parent_block_hash") else None
    for position, block_hash in enumerate(hashes):
        single = pb.KvEvent(request_id=event.request_id)
        if event.HasField("kv_session"):
            single.kv_session.CopyFrom(event.kv_session)
        block = single.block_stored
        block.CopyFrom(source)
        del block.block_hashes[:]
        block.block_hashes.add().CopyFrom(block_hash)
        if parent is not None:
            block.parent_block_hash.CopyFrom(parent)
        else:
            block.ClearField("parent_block_hash")
        if len(hashes) > 1:
            # A block's own tokens and extra keys (one entry per block), when the batch lets
            # them be attributed to it.
            del block.token_ids[:]
            if per_block:
                block.token_ids.extend(tokens[position * per_block : (position + 1) * per_block])
            del block.extra_keys[:]
            if len(source.extra_keys) == len(hashes):
                block.extra_keys.add().CopyFrom(source.extra_keys[position])
        key = (source.medium, source.group_idx, block_hash.value)
        stored.pop(key, None)
        stored[key] = single
        parent = block_hash


__all__ = ["KvEventHub"]
