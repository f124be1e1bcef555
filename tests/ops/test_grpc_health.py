"""grpc.health.v1 mirrors the OpenEngine health state; reflection lets grpcurl work without protos.

Load balancers and Kubernetes probes only see SERVING or NOT_SERVING, so the mirror must
never say SERVING before the engines' first health check has said READY, and must say
NOT_SERVING as soon as a drain begins. ``tests/ops/test_faults.py`` covers NOT_SERVING
after an engine failure and SERVING again after its recovery.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from openengine_gateway import pb, pb_later, routes_pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.spi import HealthCheck
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.fakes import FakeBackend
from tests.ops.support import gateway

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
FAST_MONITOR = GatewayOptions(health_poll_s=0.05)


class SlowToLoad(FakeBackend):
    """An engine that says STARTING (and takes a moment to say it) until the test declares it loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.health_checks = [HealthCheck("model", pb.HEALTH_STATE_STARTING, "loading")]

    async def check_health(self) -> list[HealthCheck]:
        await asyncio.sleep(0.05)  # a real check is a call (a remote, an engine process), never instant
        return await super().check_health()


async def check(running: RunningGateway, service: str = pb.SERVICE_NAME) -> int:
    probe = health_pb2_grpc.HealthStub(running.channel)
    return int((await probe.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status)


async def test_watch_follows_starting_ready_and_draining() -> None:
    backend = SlowToLoad()
    async with serve_backends([("m", backend)], options=FAST_MONITOR) as running:
        watch = health_pb2_grpc.HealthStub(running.channel).Watch(
            health_pb2.HealthCheckRequest(service=pb.SERVICE_NAME), timeout=10
        )
        assert (await watch.read()).status == NOT_SERVING
        assert await check(running) == NOT_SERVING and await check(running, "") == NOT_SERVING
        assert (await running.stub.Health(pb.HealthRequest())).state == pb.HEALTH_STATE_STARTING

        backend.health_checks = [HealthCheck("model", pb.HEALTH_STATE_READY, "loaded")]
        assert (await watch.read()).status == SERVING
        assert await check(running) == SERVING and await check(running, "") == SERVING

        drain = [r async for r in running.stub.Drain(pb.DrainRequest(stop_accepting_new_requests=True))]
        assert drain[-1].state == pb.DRAIN_STATE_COMPLETE
        assert (await asyncio.wait_for(watch.read(), 2)).status == NOT_SERVING
        assert await check(running) == NOT_SERVING and await check(running, "") == NOT_SERVING
        watch.cancel()


async def test_shutdown_tells_watchers_not_serving() -> None:
    """``stop`` flips the probes before it drains, so a balancer stops routing first."""
    async with gateway() as running:
        watch = health_pb2_grpc.HealthStub(running.channel).Watch(
            health_pb2.HealthCheckRequest(service=pb.SERVICE_NAME), timeout=10
        )
        assert (await watch.read()).status == SERVING
        stopping = asyncio.create_task(running.server.stop(1.0))
        assert (await asyncio.wait_for(watch.read(), 2)).status == NOT_SERVING
        watch.cancel()  # an open Watch would hold the server's close grace period
        await stopping


async def test_an_unknown_service_is_not_found() -> None:
    async with gateway() as running:
        probe = health_pb2_grpc.HealthStub(running.channel)
        try:
            await probe.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
        else:
            raise AssertionError("an unknown service was answered")


async def test_reflection_serves_what_grpcurl_needs() -> None:
    """The listed services, and for OpenEngine every file its messages need, enough to build a request."""
    async with gateway() as running:
        stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)

        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")
            yield reflection_pb2.ServerReflectionRequest(file_containing_symbol=pb.SERVICE_NAME)

        listed, described = [response async for response in stub.ServerReflectionInfo(requests())]
    services = {service.name for service in listed.list_services_response.service}
    assert services == {pb.SERVICE_NAME, routes_pb.SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME} | {
        *pb_later.SERVICE_NAMES,
        "grpc.reflection.v1.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(blob)
        for blob in described.file_descriptor_response.file_descriptor_proto
    ]
    pool = descriptor_pool.DescriptorPool()
    pending = {file.name: file for file in files}
    while pending:  # add each file after its dependencies, as grpcurl does
        ready = [f for f in pending.values() if all(d not in pending for d in f.dependency)]
        assert ready, f"reflection left dependencies unresolved: {sorted(pending)}"
        for file in ready:
            pool.Add(file)
            del pending[file.name]
    service = pool.FindServiceByName(pb.SERVICE_NAME)
    generate = service.FindMethodByName("Generate")
    assert generate.input_type.full_name == "openengine.v1.GenerateRequest" and generate.server_streaming
    assert {"Generate", "Embed", "Health", "Drain", "SubscribeKvEvents"} <= {m.name for m in service.methods}
