"""KV-event gaps from an engine's ZMQ publisher, with a fake publisher on loopback.

The fake speaks vLLM's ``ZmqEventPublisher`` wire format (topic, 8-byte sequence, msgpack
batch) and, optionally, its ROUTER replay protocol. A gap is repaired from the replay socket
when the publisher still holds the batches; otherwise subscribers get one terminal retryable
error naming the missing range, never a silent hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import msgpack
import pytest
import zmq
import zmq.asyncio
from openengine_gateway import pb
from openengine_gateway.spi import KvEventBatch
from openengine_gateway.spi.zmq_kv import END_SEQUENCE, repair_gaps, subscribe
from openengine_gateway.testing import serve_backends

from tests.fakes import FakeBackend
from tests.ops.conftest import Figures
from tests.ops.support import wait_until

TOPIC = b"kv"


class FakePublisher:
    """Publishes numbered batches (some "lost" on purpose) and serves replay from a buffer."""

    def __init__(self, *, replay: bool, buffer_steps: int = 10_000, answer_replay: bool = True) -> None:
        context = zmq.asyncio.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self.endpoint = f"tcp://127.0.0.1:{self._pub.bind_to_random_port('tcp://127.0.0.1')}"
        self._buffer: list[tuple[int, bytes]] = []
        self._buffer_steps = buffer_steps
        self._router: zmq.asyncio.Socket | None = None
        self._server: asyncio.Task[None] | None = None
        self.replay_endpoint = ""
        self.replays = 0
        if replay:
            self._router = context.socket(zmq.ROUTER)
            self.replay_endpoint = f"tcp://127.0.0.1:{self._router.bind_to_random_port('tcp://127.0.0.1')}"
            if answer_replay:
                self._server = asyncio.create_task(self._serve())

    async def publish(self, sequence: int, *, lost: bool = False) -> None:
        """Publish batch ``sequence`` (one BlockStored of block ``sequence``), or only buffer it."""
        payload = msgpack.packb(
            [
                time.time(),
                [{"type": "BlockStored", "block_hashes": [sequence], "parent_block_hash": None, "token_ids": [1]}],
                0,
            ]
        )
        self._buffer = [*self._buffer, (sequence, payload)][-self._buffer_steps :]
        if not lost:
            await self._pub.send_multipart((TOPIC, sequence.to_bytes(8, "big"), payload))

    async def _serve(self) -> None:
        assert self._router is not None
        while True:
            client, _, start = await self._router.recv_multipart()
            self.replays += 1
            first = int.from_bytes(start, "big")
            for sequence, payload in self._buffer:
                if sequence >= first:
                    await self._router.send_multipart((client, b"", TOPIC, sequence.to_bytes(8, "big"), payload))
            await self._router.send_multipart((client, b"", b"", END_SEQUENCE, b""))

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)


@contextlib.asynccontextmanager
async def publisher(**options: object) -> AsyncIterator[FakePublisher]:
    fake = FakePublisher(**options)  # type: ignore[arg-type]
    try:
        yield fake
    finally:
        await fake.close()


def batches(fake: FakePublisher, *, timeout_s: float = 2.0) -> AsyncIterator[KvEventBatch]:
    replay = {0: fake.replay_endpoint} if fake.replay_endpoint else {}
    return repair_gaps(subscribe({0: (fake.endpoint, TOPIC.decode())}), replay, timeout_s=timeout_s)


@contextlib.asynccontextmanager
async def joined(source: AsyncIterator[KvEventBatch]) -> AsyncIterator[asyncio.Queue[int]]:
    """``source``'s sequence numbers as they come, once its SUB socket has joined."""
    numbers: asyncio.Queue[int] = asyncio.Queue()

    async def pump() -> None:
        async for batch in source:
            numbers.put_nowait(batch.sequence_number)

    task = asyncio.create_task(pump())
    await asyncio.sleep(0.3)  # ZMQ's slow joiner: a subscription needs a moment to reach the PUB
    try:
        yield numbers
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def taken(numbers: asyncio.Queue[int], count: int) -> list[int]:
    return [await asyncio.wait_for(numbers.get(), 5) for _ in range(count)]


async def test_a_gap_is_repaired_from_the_replay_socket(figures: Figures) -> None:
    async with publisher(replay=True) as fake, joined(batches(fake)) as numbers:
        for sequence in range(6):
            await fake.publish(sequence, lost=sequence in (2, 3))
        assert await taken(numbers, 6) == list(range(1, 7))  # the engine's numbers plus one, none twice
        for sequence in range(6, 12):
            await fake.publish(sequence, lost=sequence == 7)
        assert await taken(numbers, 6) == list(range(7, 13))
        await asyncio.sleep(0.05)
        assert numbers.empty() and fake.replays == 2
    figures.record("kv gaps: lost batches repaired from the replay socket", 3)


async def test_batches_missed_before_joining_are_replayed_from_zero() -> None:
    async with publisher(replay=True) as fake:
        await fake.publish(0, lost=True)
        await fake.publish(1, lost=True)
        async with joined(batches(fake)) as numbers:
            await fake.publish(2)
            assert await taken(numbers, 3) == [1, 2, 3]


async def test_a_silent_replay_socket_leaves_the_gap_to_the_hub() -> None:
    async with publisher(replay=True, answer_replay=False) as fake, joined(batches(fake, timeout_s=0.2)) as numbers:
        await fake.publish(0)
        await fake.publish(1, lost=True)
        await fake.publish(2)
        assert await taken(numbers, 2) == [1, 3]


class ZmqBridgedBackend(FakeBackend):
    """A fake engine whose KV events come from a ZMQ publisher through the bridge."""

    def __init__(self, fake: FakePublisher) -> None:
        super().__init__(publishes_kv_events=True)
        self._fake = fake

    def kv_events(self) -> AsyncIterator[KvEventBatch]:  # type: ignore[override]
        return batches(self._fake)


@pytest.mark.parametrize("replay", [False, True])
async def test_an_unrepaired_gap_ends_subscribers_with_a_retryable_error(replay: bool, figures: Figures) -> None:
    """Without replay (or when the publisher no longer holds the batches) subscribers learn of
    the gap, replay cannot cross it, and a snapshot subscription carries on."""
    async with (
        publisher(replay=replay, buffer_steps=1) as fake,
        serve_backends([("m", ZmqBridgedBackend(fake))]) as running,
    ):
        await asyncio.sleep(0.3)  # the bridge's SUB socket joins
        stub = running.stub
        live = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        hub = running.gateway.events.kv
        await wait_until(lambda: hub.subscriber_count == 1, what="the live subscription")  # it sees what follows
        await fake.publish(0)
        await fake.publish(1)
        assert [(await asyncio.wait_for(live.read(), 5)).batch.sequence_number for _ in range(2)] == [1, 2]
        await fake.publish(2, lost=True)
        await fake.publish(3, lost=True)
        await fake.publish(4)
        final = await asyncio.wait_for(live.read(), 5)
        assert await asyncio.wait_for(live.read(), 5) is grpc.aio.EOF
        error = final.error
        assert error.code == pb.ERROR_CODE_INTERNAL and error.retryable and error.HasField("retry_after_ms")
        missing = dict(error.details)
        assert (missing["reason"], missing["missing_from"], missing["missing_to"]) == ("kv_event_gap", 3, 4)
        with pytest.raises(grpc.aio.AioRpcError) as across:
            await stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=2)).read()
        assert across.value.code() == grpc.StatusCode.OUT_OF_RANGE
        again = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True))
        snapshot = (await asyncio.wait_for(again.read(), 5)).batch
        assert snapshot.sequence_number == 5
        await fake.publish(5)
        assert (await asyncio.wait_for(again.read(), 5)).batch.sequence_number == 6
        again.cancel()
        assert hub.gaps == 1
    figures.record(f"kv gaps: unrepaired gap reported to subscribers (replay socket: {replay})", "yes")
