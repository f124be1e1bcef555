"""A driver's mistakes at request time: a retryable error naming the plugin, counted, and Health NOT_READY.

A wrong return type, a missing attribute or an exception escaping the driver is the plugin's fault, so
no request ends in INTERNAL because of it (that stays for the gateway's own bugs), and an operator sees
which plugin and why in Health and the metrics. Served over real gRPC by ``testing.serve_backends``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.client import text_request
from openengine_gateway.server.metrics import MetricsExporter
from openengine_gateway.spi import (
    EmbedCall,
    Embedding,
    EventStream,
    GenerationRequest,
    KvEventSource,
    Load,
    TaskUsage,
    UsageReport,
)
from openengine_gateway.testing import RunningGateway, serve_backends


class Sloppy(MockBackend):
    """A driver of today's revision with the mistakes a plugin author makes."""

    name = "sloppy"

    def generate(self, request: GenerationRequest) -> EventStream:
        if request.prompt == "raise":
            return self.no_such_attribute  # type: ignore[attr-defined,no-any-return]
        if request.prompt == "late":
            return EventStream.from_iterator(self._broken())
        return self._events()  # type: ignore[return-value]  # revision 1's shape, undeclared

    async def _events(self) -> AsyncIterator[UsageReport]:
        yield UsageReport(1, 0)

    async def _broken(self) -> AsyncIterator[UsageReport]:
        yield UsageReport(1, 0)
        raise KeyError("slot")

    async def load(self) -> Load:
        return pb.LoadInfo(running_requests=1)  # type: ignore[return-value]

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        raise AttributeError("'NoneType' object has no attribute 'pooler'")

    def kv_event_sources(self) -> list[KvEventSource]:
        return [pb.KvEventSource(topic="kv")]  # type: ignore[list-item]


async def generate(running: RunningGateway, prompt: str) -> list[pb.GenerateResponse]:
    return [message async for message in running.stub.Generate(text_request(prompt, model="m", max_tokens=2))]


@pytest.mark.parametrize(
    ("prompt", "what"),
    [
        ("wrong type", "generate returned async_generator, not an EventStream"),
        ("raise", "generate raised AttributeError: 'Sloppy' object has no attribute 'no_such_attribute'"),
        ("late", "its event stream raised KeyError: 'slot'"),
    ],
)
async def test_a_generate_the_driver_gets_wrong_ends_in_a_retryable_error_naming_it(prompt: str, what: str) -> None:
    async with serve_backends([("m", Sloppy(Sloppy.Settings()))]) as running:
        messages = await generate(running, prompt)
        error = messages[-1].error
        assert messages[-1].HasField("error") and error.code == pb.ERROR_CODE_INTERNAL
        assert error.retryable and error.retry_after_ms == 1000
        assert error.message == f"backend 'sloppy' broke the backend SPI: {what}"
        health = await running.stub.Health(pb.HealthRequest())
        assert health.state == pb.HEALTH_STATE_NOT_READY
        (driver,) = [check for check in health.checks if check.name == "driver"]
        assert (driver.state, driver.message) == (pb.HEALTH_STATE_NOT_READY, error.message)
        exporter = MetricsExporter(running.gateway)
        labels = {"model": "m", "backend": "sloppy"}
        assert exporter.registry.get_sample_value("openengine_gateway_driver_faults_total", labels) == 1


async def test_a_unary_call_the_driver_gets_wrong_is_unavailable_naming_it() -> None:
    async with serve_backends([("m", Sloppy(Sloppy.Settings()))]) as running:
        with pytest.raises(grpc.aio.AioRpcError) as load:
            await running.stub.GetLoad(pb.GetLoadRequest())
        assert load.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (
            load.value.details() == "backend 'sloppy' broke the backend SPI: load returned pb.LoadInfo, not an spi.Load"
        )
        request = pb.EmbedRequest(
            context=pb.TaskRequestContext(request_id="e", model="m"), inputs=[pb.TaskInput(item_id="a", text="x")]
        )
        with pytest.raises(grpc.aio.AioRpcError) as embed:
            await running.stub.Embed(request)
        assert embed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert embed.value.details() == (
            "backend 'sloppy' broke the backend SPI: embed raised AttributeError: "
            "'NoneType' object has no attribute 'pooler'"
        )
        with pytest.raises(grpc.aio.AioRpcError) as sources:
            await running.stub.GetKvEventSources(pb.GetKvEventSourcesRequest())
        assert sources.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "kv_event_sources returned a pb.KvEventSource, not an spi.KvEventSource" in (
            sources.value.details() or ""
        )
        assert running.gateway.engines.engine("m").faults.count == 3
