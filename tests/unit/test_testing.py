"""``testing.serve_backends``: the in-process gateway over real gRPC that plugin authors use."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from openengine_gateway import pb
from openengine_gateway.errors import CapabilityError
from openengine_gateway.spi import EngineFacts, OutputFinished, TokenDelta, TokenRecord, UsageReport
from openengine_gateway.testing import serve_backends

from tests.fakes import FakeBackend, collect, scripted


async def test_generate_and_discovery_over_grpc() -> None:
    backend = FakeBackend()
    backend.on_generate = scripted(
        TokenDelta(0, [TokenRecord(7, "hi")], "hi"), UsageReport(1, 1), OutputFinished(0, pb.FINISH_REASON_LENGTH)
    )
    async with serve_backends([("m", backend, ["alias"])]) as running:
        assert backend.started and running.address.startswith("127.0.0.1:")
        info = await running.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert (info.schema_revision, info.minimum_client_revision) == (1, 1)
        assert list(info.supported_models) == ["m", "alias"]
        messages = await collect(running.stub.Generate(pb.GenerateRequest(request_id="r", model="alias", prompt="x")))
        assert [m.WhichOneof("event") for m in messages] == ["token", "finished"]
        assert messages[0].token.HasField("output_index") and messages[-1].usage.total_tokens == 2
        assert running.gateway.registry.recently_finished("r")
    assert backend.stopped


async def test_pre_acceptance_errors_are_statuses() -> None:
    async with serve_backends([("m", FakeBackend())]) as running:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(running.stub.Generate(pb.GenerateRequest(model="nope", prompt="x")))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert "served models: ['m']" in (raised.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.stub.Abort(pb.AbortRequest())
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_reflection_describes_the_service() -> None:
    async with serve_backends([("m", FakeBackend())]) as running:
        stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)

        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")
            yield reflection_pb2.ServerReflectionRequest(file_containing_symbol=pb.SERVICE_NAME)

        listed, described = await collect(stub.ServerReflectionInfo(requests()))
        assert pb.SERVICE_NAME in [s.name for s in listed.list_services_response.service]
        assert described.WhichOneof("message_response") == "file_descriptor_response", described.error_response


async def test_a_failed_start_stops_the_started_backends() -> None:
    class Broken(FakeBackend):
        async def start(self) -> EngineFacts:
            raise RuntimeError("no GPU")

    first = FakeBackend()
    with pytest.raises(RuntimeError, match="no GPU"):
        async with serve_backends([("a", first), ("b", Broken())]):
            pass
    assert first.stopped


async def test_a_started_backend_with_a_refused_table_is_stopped() -> None:
    refused = FakeBackend(model=pb.ModelInfo(max_output_tokens=0))
    with pytest.raises(CapabilityError):
        async with serve_backends([("a", refused)]):
            pass
    assert refused.started and refused.stopped
