"""The remote's KV and runtime event streams, relayed across disconnects.

A relay subscribes on the remote and yields what arrives; when the subscription ends (the
remote restarted, drained, dropped a slow subscriber, or the network failed) it waits and
subscribes again. KV events resume exactly: ``KvCursor`` remembers the last sequence number
per rank, replays from there and drops what it already delivered; when the remote can no
longer replay (OUT_OF_RANGE) or restarted (a new ``instance_id``), it starts over from a
snapshot whose first batch per rank clears what the front knew of that rank. Runtime events
are live observations: a gap is lost, as it would be for any subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from openengine_gateway import pb
from openengine_gateway.client import OpenEngineClient, StatusError
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import KvEventBatch
from openengine_gateway.spi.wire import kv_batch

log = logging.getLogger(__name__)

_MAX_BACKOFF = 16
"""The longest wait between subscriptions, in multiples of the first."""


class KvCursor:
    """Where a KV relay stands on the remote, and what to ask for next."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        """The last sequence number delivered, per remote rank."""
        self.instance_id: str | None = None
        self._resync = True
        self._snapshot_ranks: set[int] | None = None

    def request(self, instance_id: str) -> pb.SubscribeKvEventsRequest:
        """The next subscription: a replay after what was delivered, or a fresh snapshot."""
        if instance_id != self.instance_id:
            self._resync = True  # a restarted remote numbers (and holds) its blocks anew
            self.instance_id = instance_id
        if self._resync or not self.last:
            self._resync = False
            self._snapshot_ranks = set()
            return pb.SubscribeKvEventsRequest(include_snapshot=True)
        self._snapshot_ranks = None
        return pb.SubscribeKvEventsRequest(start_sequence_number=min(self.last.values()) + 1)

    def resync(self) -> None:
        """The remote no longer retains the replay: start over from a snapshot."""
        self._resync = True

    def accept(self, batch: pb.KvEventBatch) -> pb.KvEventBatch | None:
        """The batch to deliver, or None for a replayed duplicate or an empty first snapshot."""
        rank, number = batch.data_parallel_rank, batch.sequence_number
        snapshots = self._snapshot_ranks
        if snapshots is not None and rank not in snapshots:
            snapshots.add(rank)  # the first batch of each rank in a snapshot subscription is its snapshot
            known = rank in self.last
            self.last[rank] = number
            if known:  # a resync: what the front knew of this rank is replaced by the snapshot
                events = list(batch.events)
                del batch.events[:]
                batch.events.add(all_blocks_cleared=pb.AllBlocksCleared())
                batch.events.extend(events)
                return batch
            return batch if batch.events else None
        if number <= self.last.get(rank, 0):
            return None
        self.last[rank] = number
        return batch


class Backoff:
    """Doubling waits between attempts, back to the first after a success."""

    def __init__(self, first_s: float) -> None:
        self._first = first_s
        self._next = first_s

    @property
    def delay_s(self) -> float:
        """How long the next ``wait`` sleeps."""
        return self._next

    def reset(self) -> None:
        """A subscription delivered: the next failure waits the shortest time again."""
        self._next = self._first

    async def wait(self) -> None:
        """Sleep, and double the next wait (up to ``_MAX_BACKOFF`` times the first)."""
        await asyncio.sleep(self._next)
        self._next = min(self._next * 2, self._first * _MAX_BACKOFF)


async def publishes(stream: AsyncIterator[object], within_s: float) -> bool:
    """Whether the remote accepts a subscription: a message, or an open quiet stream, says yes.

    The stream is closed afterwards either way.
    """
    try:
        await asyncio.wait_for(anext(stream), within_s)
        return True
    except (TimeoutError, StopAsyncIteration):
        return True
    except StatusError as error:
        log.info("the remote refused the subscription (%s): not relaying it", error)
        return False
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


async def relay_kv(
    client: OpenEngineClient, cursor: KvCursor, *, retry_s: float, timeout_s: float
) -> AsyncIterator[KvEventBatch]:
    """The remote's KV event batches, exactly once each, for as long as the relay runs."""
    backoff = Backoff(retry_s)
    while True:
        try:
            info = await client.get_engine_info(timeout_s=timeout_s)
            async for response in client.kv_events(cursor.request(info.instance_id)):
                if response.HasField("error"):
                    log.info("the remote ended its KV event stream: %s", response.error.message)
                    break
                backoff.reset()
                batch = cursor.accept(response.batch)
                if batch is not None:
                    yield kv_batch(batch)
        except StatusError as error:
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                raise EngineFailure(
                    pb.ERROR_CODE_INTERNAL, f"the remote no longer publishes KV events: {error}"
                ) from None
            if error.code == grpc.StatusCode.OUT_OF_RANGE:
                cursor.resync()
            log.warning("the remote's KV event stream failed (%s); subscribing again", error)
        await backoff.wait()


async def relay_runtime(client: OpenEngineClient, *, retry_s: float) -> AsyncIterator[pb.RuntimeEvent]:
    """The remote's runtime events, live, for as long as the relay runs."""
    backoff = Backoff(retry_s)
    while True:
        try:
            async for response in client.runtime_events(pb.SubscribeRuntimeEventsRequest()):
                if response.HasField("error"):
                    log.info("the remote ended its runtime event stream: %s", response.error.message)
                    break
                backoff.reset()
                yield response.runtime_event
        except StatusError as error:
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                raise EngineFailure(
                    pb.ERROR_CODE_INTERNAL, f"the remote no longer publishes runtime events: {error}"
                ) from None
            log.warning("the remote's runtime event stream failed (%s); subscribing again", error)
        await backoff.wait()


__all__ = ["Backoff", "KvCursor", "publishes", "relay_kv", "relay_runtime"]
