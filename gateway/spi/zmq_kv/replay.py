"""Gap repair for engine-native ZMQ KV-event streams, from the publisher's replay socket.

A ZMQ SUB socket drops messages silently (a slow joiner, a full high-water mark), so a
stream of decoded batches (``zmq_kv.subscribe``) can skip sequence numbers. vLLM's
and SGLang's ``ZmqEventPublisher`` keep their last ``buffer_steps`` batches behind a ROUTER
socket (``replay_endpoint``): send an empty frame and an 8-byte big-endian start sequence,
receive ``["", topic, seq, payload]`` per buffered batch from there on, then the end marker
``["", "", -1, ""]``. ``repair_gaps`` watches each rank's numbers and, on a gap (or a first
batch past number zero), fetches the missing batches before passing the stream on, so the
gateway sees them in order. What the publisher no longer holds, or a rank without a replay
socket, stays a gap: the gateway's KV hub reports it to subscribers, never hiding it.

Numbers here are the gateway's (the engine's plus one), as ``decode_batch`` yields them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import zmq
import zmq.asyncio

from ..kv_events import KvEventBatch
from .events import connect_address, decode_batch

log = logging.getLogger(__name__)

END_SEQUENCE = (-1).to_bytes(8, "big", signed=True)
"""The publisher's end-of-replay marker."""


async def repair_gaps(
    source: AsyncIterator[KvEventBatch], replay_endpoints: Mapping[int, str], *, timeout_s: float = 2.0
) -> AsyncIterator[KvEventBatch]:
    """``source`` with each rank's skipped batches fetched from its replay endpoint, in order."""
    last: dict[int, int] = {}
    replayed: dict[int, tuple[int, int]] = {}  # rank -> (after, through): live duplicates of a replay
    async for batch in source:
        rank, number = batch.data_parallel_rank, batch.sequence_number
        window = replayed.get(rank)
        if window is not None:
            if window[0] < number <= window[1]:
                continue  # arrived live after the replay already delivered it
            if number > window[1]:
                del replayed[rank]
        endpoint = replay_endpoints.get(rank)
        expected = last.get(rank, 0) + 1 if endpoint is not None else None
        if expected is not None and endpoint is not None and number > expected:
            log.info("KV events of rank %d skipped %d..%d; replaying from %s", rank, expected, number - 1, endpoint)
            recovered = await fetch_replay(endpoint, expected - 1, rank, timeout_s=timeout_s)
            after = last.get(rank, 0)
            for missed in recovered:
                if missed.sequence_number > last.get(rank, 0):
                    last[rank] = missed.sequence_number
                    yield missed
            replayed[rank] = (after, last.get(rank, 0))
            if number <= last.get(rank, 0):
                continue
        last[rank] = number
        yield batch


async def fetch_replay(endpoint: str, start: int, rank: int, *, timeout_s: float) -> list[KvEventBatch]:
    """The batches a publisher still holds from engine sequence ``start`` on (possibly none)."""
    socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    batches: list[KvEventBatch] = []
    try:
        socket.connect(connect_address(endpoint))
        await socket.send_multipart((b"", start.to_bytes(8, "big")))
        while await socket.poll(timeout_s * 1000):
            frames = await socket.recv_multipart()
            if len(frames) != 4:
                continue
            _, _, sequence, payload = frames
            if sequence == END_SEQUENCE:
                return batches
            batches.append(decode_batch(payload, int.from_bytes(sequence, "big"), default_rank=rank))
        log.warning("the KV event replay at %s did not finish within %gs", endpoint, timeout_s)
        return batches
    finally:
        socket.close(linger=0)


__all__ = ["END_SEQUENCE", "fetch_replay", "repair_gaps"]
