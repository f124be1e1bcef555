"""Fault injection over real gRPC: the engine dies mid-stream, an engine hangs while its health
fails, a KV subscriber stalls, and drains run with and without deadlines. Each ends with
the contract's terminal events, loses nothing, and leaves nothing in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.spi import EventStream, GenerationRequest, HealthCheck
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.fakes import FakeBackend
from tests.ops.conftest import Figures
from tests.ops.streams import ending
from tests.ops.support import engine_idle, gateway, wait_until

FAST_MONITOR = GatewayOptions(health_poll_s=0.05)


def generate(max_tokens: int) -> pb.GenerateRequest:
    """Exactly ``max_tokens`` tokens (the model's EOS does not end it early)."""
    stopping = pb.StoppingOptions(max_tokens=max_tokens, ignore_eos=True)
    return pb.GenerateRequest(model="mock", prompt="the quick brown fox", stopping=stopping)


async def collect(call: grpc.aio.UnaryStreamCall) -> list[Any]:  # type: ignore[type-arg]
    """The call's remaining messages (read with ``read``, so a first ``read`` may precede it)."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def serving(running: RunningGateway) -> int:
    probe = health_pb2_grpc.HealthStub(running.channel)
    return int((await probe.Check(health_pb2.HealthCheckRequest(service=pb.SERVICE_NAME))).status)


async def wait_serving(running: RunningGateway, status: int) -> None:
    for _ in range(200):
        if await serving(running) == status:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"grpc.health.v1 never reported {status}")


async def test_an_engine_killed_mid_stream(figures: Figures) -> None:
    async with gateway(options=FAST_MONITOR, decode_time_per_step_s=0.01) as running:
        stub = running.stub
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        streams = [stub.Generate(generate(1000)) for _ in range(8)]
        started = [await stream.read() for stream in streams]
        backend.fail("killed by the test")
        endings = [
            ending([*first, *await collect(stream)])
            for first, stream in zip(([s] for s in started), streams, strict=True)
        ]
        for end in endings:
            assert end.error is not None and end.error.retryable and end.error.HasField("retry_after_ms")
        await wait_until(lambda: len(running.gateway.registry) == 0, what="no request in flight")
        health = await stub.Health(pb.HealthRequest())
        assert health.state == pb.HEALTH_STATE_NOT_READY
        await wait_serving(running, health_pb2.HealthCheckResponse.NOT_SERVING)
        for call in (
            collect(stub.Generate(generate(4))),
            stub.Embed(
                pb.EmbedRequest(
                    context=pb.TaskRequestContext(request_id="e", model="mock"),
                    inputs=[pb.TaskInput(item_id="a", text="x")],
                )
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(refused.value.trailing_metadata() or ()).get("retry-after-ms") == "1000"  # type: ignore[arg-type]
        backend.restart()
        await wait_serving(running, health_pb2.HealthCheckResponse.SERVING)
        assert (await stub.Health(pb.HealthRequest())).state == pb.HEALTH_STATE_READY
        assert ending(await collect(stub.Generate(generate(4)))).error is None
        assert "mock" not in running.gateway.state.engines_down and engine_idle(backend)
    figures.record("fault: streams ended by an engine kill, each with one retryable EngineError", len(endings))


async def test_an_engine_that_hangs_while_its_health_fails() -> None:
    """The gateway does not wait on a driver that never ends its streams once its engine is down."""
    backend = FakeBackend(model=pb.ModelInfo(supports_text_input=True))
    hung: list[EventStream] = []

    def never_ending(_request: GenerationRequest) -> EventStream:
        stream = EventStream()
        hung.append(stream)
        return stream

    backend.on_generate = never_ending  # type: ignore[assignment]
    async with serve_backends([("mock", backend)], options=FAST_MONITOR) as running:
        streams = [running.stub.Generate(generate(4)) for _ in range(3)]
        await wait_until(lambda: len(running.gateway.registry) == 3, what="three streams in flight")
        backend.health_checks = [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, "wedged")]
        for stream in streams:
            end = ending(await collect(stream))
            assert end.error is not None and end.error.retryable and "wedged" in end.error.message
        assert sorted(backend.aborted) == sorted(r.request_id for r in backend.requests)
        backend.health_checks = [HealthCheck("model", pb.HEALTH_STATE_READY, "ok")]
        await wait_until(lambda: not running.gateway.state.engines_down, what="recovery")
        assert len(running.gateway.registry) == 0


async def test_a_slow_kv_subscriber_is_ended_and_loses_nothing(figures: Figures) -> None:
    """A subscriber that stops reading ends with OVERLOADED and where to resume; resuming there
    yields exactly what a subscriber that kept up received."""
    options = GatewayOptions(subscriber_queue=256, kv_replay_batches=100_000)
    async with gateway(options=options, kv_block_size=1, total_kv_blocks=4096, decode_time_per_step_s=0.001) as running:
        stub = running.stub
        fast = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=1))
        # A client that stops reading stalls the server's writes once its HTTP/2 window is full;
        # without BDP probing that window stays small, so the stall reaches the hub quickly.
        stalled = grpc.aio.insecure_channel(running.address, options=[("grpc.http2.bdp_probe", 0)])
        slow = pb.OpenEngineStub(stalled).SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=1))
        hub = running.gateway.events.kv
        await wait_until(lambda: hub.subscriber_count == 2, what="two subscribers")
        received: list[int] = []

        async def keep_up() -> None:
            while (response := await fast.read()) is not grpc.aio.EOF:
                received.append(response.batch.sequence_number)

        reader = asyncio.create_task(keep_up())
        rounds = 0
        while hub.dropped_subscribers == 0 and rounds < 500:
            await asyncio.gather(*(collect(stub.Generate(generate(100))) for _ in range(2)))
            rounds += 1
        assert hub.dropped_subscribers == 1, "the stalled subscriber was never ended"
        behind = await collect(slow)
        assert behind[-1].HasField("error") and all(r.HasField("batch") for r in behind[:-1])
        error = behind[-1].error
        assert error.code == pb.ERROR_CODE_OVERLOADED and error.retryable
        resume = int(error.details["resume_sequence_numbers"]["0"])
        await wait_until(lambda: len(received) and received[-1] == hub_last(running), what="the fast reader")
        resumed = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=resume))
        tail: list[int] = []
        while not tail or tail[-1] < received[-1]:
            tail.append((await resumed.read()).batch.sequence_number)
        resumed.cancel()
        reader.cancel()
        await stalled.close()
        slow_view = [r.batch.sequence_number for r in behind[:-1]] + tail
        assert slow_view == received == list(range(1, received[-1] + 1))
    figures.record("fault: KV batches a stalled subscriber recovered by resuming", len(tail))


def hub_last(running: RunningGateway) -> int:
    return running.gateway.events.kv._ranks[0].last_sequence  # the newest batch published


@pytest.mark.parametrize("mode", ["no deadline", "deadline then abort", "deadline without abort"])
async def test_drain(mode: str) -> None:
    async with gateway(decode_time_per_step_s=0.005) as running:
        stub = running.stub
        max_tokens = 30 if mode == "no deadline" else 300
        streams = [stub.Generate(generate(max_tokens)) for _ in range(4)]
        firsts = [await stream.read() for stream in streams]
        request = pb.DrainRequest(stop_accepting_new_requests=True)
        if mode != "no deadline":
            request.deadline_ms = 200
            request.abort_after_deadline = mode == "deadline then abort"
        drain = [message async for message in stub.Drain(request)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(stub.Generate(generate(4)))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        endings = [ending([first, *await collect(s)]) for first, s in zip(firsts, streams, strict=True)]
        assert drain[0].state == pb.DRAIN_STATE_STARTED
        if mode == "deadline without abort":
            assert drain[-1].HasField("error") and drain[-1].error.code == pb.ERROR_CODE_DRAINING
            assert drain[-1].error.retryable and drain[-1].error.details["in_flight_requests"] == 4
            assert all(end.reasons == {0: pb.FINISH_REASON_LENGTH} for end in endings)  # still ran to the end
        else:
            assert drain[-1].state == pb.DRAIN_STATE_COMPLETE and drain[-1].in_flight_requests == 0
            expected = pb.FINISH_REASON_LENGTH if mode == "no deadline" else pb.FINISH_REASON_CANCELLED
            assert all(end.reasons == {0: expected} for end in endings), [(e.reasons, e.error) for e in endings]
        await wait_until(lambda: len(running.gateway.registry) == 0)
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        await wait_until(lambda: engine_idle(backend), what="the engine idles")
