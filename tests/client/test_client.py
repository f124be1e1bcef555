"""``OpenEngineClient`` and ``SyncClient`` against a real in-process gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.client import (
    ClientError,
    EngineErrorEvent,
    IncompatibleServer,
    OpenEngineClient,
    StatusError,
    SyncClient,
    text_request,
)
from openengine_gateway.errors import EngineFailure
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.fakes import FakeBackend, scripted


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    async with serve_backends([("mock", MockBackend(MockSettings()))]) as running:
        yield running


def test_text_request_places_flat_options_in_their_groups() -> None:
    request = text_request([1, 2], model="m", max_tokens=4, temperature=0.0, stop=["."], data_parallel_rank=1)
    assert list(request.token_ids.ids) == [1, 2] and request.model == "m"
    assert request.stopping.max_tokens == 4 and request.sampling.HasField("temperature")
    assert request.stopping.conditions[0].stop_text == "." and request.kv.data_parallel_rank == 1
    with pytest.raises(TypeError, match="unknown generation option 'nope'"):
        text_request("x", nope=1)
    assert [c.stop_text for c in text_request("x", stop="end").stopping.conditions] == ["end"], "not e, n, d"


async def test_leaving_a_stream_early_cancels_the_request() -> None:
    """The server stops the work of a client that stopped reading (break, aclose)."""
    slow = MockBackend(MockSettings(decode_time_per_step_s=0.01))  # the request alone runs for 5 s
    async with serve_backends([("mock", slow)]) as running, await OpenEngineClient.connect(running.address) as client:
        stream = client.stream(text_request("Hello", max_tokens=500, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
        registry = running.gateway.registry
        async with asyncio.timeout(2):
            while len(registry):
                await registry.wait_changed(None)


async def test_generate_collects_every_output(gateway: RunningGateway) -> None:
    async with await OpenEngineClient.connect(gateway.address) as client:
        assert client.engine_info is not None and client.engine_info.supported_models == ["mock"]
        completion = await client.generate(text_request("Hello", max_tokens=5, num_sequences=2, seed=1))
    assert [o.index for o in completion.outputs] == [0, 1]
    assert all(len(o.token_ids) <= 5 and o.finish_reason for o in completion.outputs)
    assert completion.usage.completion_tokens == sum(len(o.tokens) for o in completion.outputs)


async def test_connect_fails_closed_on_schema_drift(gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb, "SCHEMA_RELEASE", "v1-moved")  # what the server now advertises
    with pytest.raises(IncompatibleServer, match="'v1-moved' was not tested"):
        await OpenEngineClient.connect(gateway.address)
    async with await OpenEngineClient.connect(gateway.address, check_compatibility=False) as client:
        assert client.engine_info is not None and client.engine_info.schema_release == "v1-moved"


async def test_a_status_carries_its_code_and_retry_hint(gateway: RunningGateway) -> None:
    async with await OpenEngineClient.connect(gateway.address) as client:
        with pytest.raises(StatusError) as unknown:
            await client.model_info("nope")
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND and unknown.value.retry_after_ms is None
        gateway.gateway.state.draining = True
        with pytest.raises(StatusError) as draining:
            await client.generate(text_request("Hello", max_tokens=1))
    assert draining.value.code == grpc.StatusCode.UNAVAILABLE and draining.value.retry_after_ms == 1000
    assert "draining" in draining.value.details and str(draining.value).startswith("UNAVAILABLE")


async def test_a_terminal_engine_error_is_raised_with_its_error() -> None:
    backend = FakeBackend()
    failure = EngineFailure(pb.ERROR_CODE_OVERLOADED, "too busy", retryable=True, retry_after_ms=5)
    backend.on_generate = scripted(error=failure)
    async with serve_backends([("m", backend)]) as running, await OpenEngineClient.connect(running.address) as client:
        with pytest.raises(EngineErrorEvent, match="ERROR_CODE_OVERLOADED: too busy") as raised:
            await client.generate(text_request("Hello", max_tokens=1))
        error = raised.value
        assert (error.code, error.retryable, error.retry_after_ms) == (pb.ERROR_CODE_OVERLOADED, True, 5)
        # the raw stream yields the same error as an event instead of raising
        request = text_request("Hello", request_id="raw", max_tokens=1)
        messages = [m async for m in client.stream(request)]
    assert [m.WhichOneof("event") for m in messages] == ["error"]


async def test_sync_client(gateway: RunningGateway) -> None:
    def use() -> tuple[str, int, grpc.StatusCode]:
        with SyncClient(gateway.address) as client:
            completion = client.generate(text_request("Hello", max_tokens=3, temperature=0.0))
            health = client.health()
            with pytest.raises(StatusError) as unknown:
                client.abort(pb.AbortRequest(request_id="never-seen"))
            return completion.outputs[0].text, health.state, unknown.value.code

    text, state, code = await asyncio.to_thread(use)  # blocking calls, off the server's loop
    assert text and state == pb.HEALTH_STATE_READY and code == grpc.StatusCode.NOT_FOUND


async def test_a_closed_sync_client_closes_again_quietly_and_refuses_calls(gateway: RunningGateway) -> None:
    def use() -> None:
        with SyncClient(gateway.address) as client:
            client.close()
        with pytest.raises(ClientError, match="closed"):
            client.health()

    await asyncio.to_thread(use)


async def test_sync_client_that_cannot_connect_leaves_nothing_running() -> None:
    def connect() -> None:
        SyncClient("127.0.0.1:1", timeout_s=0.5)

    with pytest.raises(StatusError) as raised:
        await asyncio.to_thread(connect)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
