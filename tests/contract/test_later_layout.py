"""The later layout (``openengine.v1.Inference`` + ``Control``) over real gRPC, beside the seed's, on one port.

Clients here use the later layout's own generated stubs (``pb_later``), as Dynamo's sidecar and TensorRT-LLM's
tests do: the RPCs they call, the errors they get, and bytes of each layout sent to the other layout's methods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from openengine_gateway import pb, pb_later
from openengine_gateway.server.app import SERVED_SERVICES, ServerOptions
from openengine_gateway.server.auth import TokenAuth
from openengine_gateway.testing import RunningGateway, serve_backends

from .conftest import mock

PROMPT_IDS = list(range(1, 11))


@contextlib.asynccontextmanager
async def later(
    **settings: object,
) -> AsyncIterator[tuple[RunningGateway, pb_later.InferenceStub, pb_later.ControlStub]]:
    async with serve_backends([("model", mock(**settings))]) as running:
        yield running, pb_later.InferenceStub(running.channel), pb_later.ControlStub(running.channel)


def _request(request_id: str, max_tokens: int = 4) -> pb_later.GenerateRequest:
    request = pb_later.GenerateRequest(
        request_id=request_id, model="model", token_ids=pb_later.TokenIds(ids=PROMPT_IDS)
    )
    request.stopping.max_tokens = max_tokens
    request.sampling.seed = 5  # the mock samples at random unless seeded
    return request


async def test_generate_streams_tokens_and_usage_as_the_seed_does() -> None:
    async with later() as (running, inference, _):
        events = [event async for event in inference.Generate(_request("same-1"))]
        seed = pb.GenerateRequest(request_id="same-1", model="model", token_ids=pb.TokenIds(ids=PROMPT_IDS))
        seed.stopping.max_tokens = 4
        seed.sampling.seed = 5
        seed_events = [event async for event in running.stub.Generate(seed)]
    assert all(isinstance(event, pb_later.GenerateResponse) for event in events)
    tokens = [t.token_id for event in events if event.HasField("token") for t in event.token.tokens]
    seed_tokens = [t.token_id for event in seed_events if event.HasField("token") for t in event.token.tokens]
    assert len(tokens) == 4 and tokens == seed_tokens
    final = events[-1]
    assert final.finished.reason == pb_later.FINISH_REASON_LENGTH and final.request_id == "same-1"
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (10, 4, 14)


async def test_model_and_server_info() -> None:
    async with later(max_context_length=2048, kv_block_size=16) as (_, _inference, control):
        model = await control.GetModelInfo(pb_later.GetModelInfoRequest(model="model"))
        server = await control.GetServerInfo(pb_later.GetServerInfoRequest())
        health = await control.Health(pb_later.HealthRequest())
        load = await control.GetLoad(pb_later.GetLoadRequest(include_per_rank=True))
    assert model.max_context_length == 2048 and model.generation.supports_cache_salt
    assert (server.schema_revision, server.minimum_client_revision, server.schema_release) == (
        pb_later.SCHEMA_REVISION,
        pb_later.MINIMUM_CLIENT_REVISION,
        pb_later.SCHEMA_RELEASE,
    )
    assert list(server.supported_models) == ["model"] and server.engine_role == pb_later.ENGINE_ROLE_AGGREGATED
    assert server.capacity.kv_block_size == 16 and server.capacity.total_kv_blocks == 1024
    assert health.state == pb_later.HEALTH_STATE_READY
    assert load.instance_id and load.total_kv_blocks == 1024


async def test_abort_stops_a_running_request() -> None:
    async with later(decode_time_per_step_s=0.01) as (_running, inference, control):
        call = inference.Generate(_request("long-1", max_tokens=1000))
        first = await call.read()
        assert first.HasField("token")
        aborted = await control.Abort(pb_later.AbortRequest(request_id="long-1"))
        rest = []
        while (event := await call.read()) is not grpc.aio.EOF:
            rest.append(event)
        again = await control.Abort(pb_later.AbortRequest(request_id="long-1"))
    assert aborted.status == pb_later.ABORT_STATUS_ABORTED
    assert rest[-1].finished.reason == pb_later.FINISH_REASON_CANCELLED and rest[-1].HasField("usage")
    assert rest[-1].usage.completion_tokens < 1000
    assert again.status == pb_later.ABORT_STATUS_ALREADY_FINISHED


async def test_errors_are_statuses_and_extra_is_refused_by_name() -> None:
    async with later(enable_cache_salt=False) as (_, inference, control):
        with pytest.raises(grpc.aio.AioRpcError) as unknown_model:
            await control.GetModelInfo(pb_later.GetModelInfoRequest(model="nope"))
        request = _request("x-1")
        request.extra.update({"speculative_k": 4})
        with pytest.raises(grpc.aio.AioRpcError) as extra:
            async for _ in inference.Generate(request):
                pass
        salted = _request("x-2")
        salted.kv.cache_salt = "tenant"
        with pytest.raises(grpc.aio.AioRpcError) as salt:
            async for _ in inference.Generate(salted):
                pass
        with pytest.raises(grpc.aio.AioRpcError) as priority:
            async for _ in inference.Generate(_request("x-3"), metadata=(("openengine-priority", "high"),)):
                pass
    assert unknown_model.value.code() is grpc.StatusCode.NOT_FOUND
    assert extra.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "extra.speculative_k" in extra.value.details()
    assert salt.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "cache_salt" in salt.value.details()
    assert (
        priority.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "openengine-priority" in priority.value.details()
    )


# -- each layout's bytes on the other layout's method ------------------------------------------------


async def _raw_stream(channel: grpc.aio.Channel, method: str, data: bytes) -> list[bytes]:
    call = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
    return [message async for message in call(data)]


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("cache_salt", lambda r: setattr(r.kv, "cache_salt", "tenant-a")),
        ("extra", lambda r: r.extra.update({"k": 1})),
    ],
)
async def test_later_bytes_on_the_seed_path_are_refused(name: str, build: object) -> None:
    async with later() as (running, _inference, _control):
        request = _request(f"cross-{name}")
        build(request)  # type: ignore[operator]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _raw_stream(running.channel, "/openengine.v1.OpenEngine/Generate", request.SerializeToString())
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "later layout" not in refused.value.details() and "field number" in refused.value.details()


async def test_later_bypass_prefix_cache_on_the_seed_path_is_never_a_silent_rank() -> None:
    """``kv.bypass_prefix_cache = true`` (later field 2) reads as the seed's data_parallel_rank 1: on this
    one-rank endpoint that is refused; ``false`` reads as rank 0, the only rank: the same answer."""
    async with later() as (running, inference, _control):
        request = _request("bypass-true")
        request.kv.bypass_prefix_cache = True
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _raw_stream(running.channel, "/openengine.v1.OpenEngine/Generate", request.SerializeToString())
        request = _request("bypass-false")
        request.kv.bypass_prefix_cache = False
        raw = await _raw_stream(running.channel, "/openengine.v1.OpenEngine/Generate", request.SerializeToString())
        direct = [event async for event in inference.Generate(_request("bypass-direct"))]
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    tokens = [t.token_id for data in raw for t in pb.GenerateResponse.FromString(data).token.tokens]
    assert tokens == [t.token_id for event in direct for t in event.token.tokens]


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("priority", lambda r: setattr(r, "priority", 3)),
        ("bypass_prefix_cache", lambda r: setattr(r.kv, "bypass_prefix_cache", True)),
        ("cache_salt", lambda r: setattr(r.kv, "cache_salt", "tenant-a")),
        ("metadata", lambda r: r.metadata.update({"k": "v"})),
    ],
)
async def test_seed_bytes_on_the_later_path_are_refused(name: str, build: object) -> None:
    async with later() as (running, _inference, _control):
        request = pb.GenerateRequest(request_id=f"cross-{name}", model="model", token_ids=pb.TokenIds(ids=PROMPT_IDS))
        build(request)  # type: ignore[operator]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _raw_stream(running.channel, "/openengine.v1.Inference/Generate", request.SerializeToString())
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "field number" in refused.value.details()


async def test_requests_of_the_same_bytes_answer_alike_on_either_path() -> None:
    async with later() as (running, _inference, _control):
        abort = pb.AbortRequest(request_id="never-seen").SerializeToString()
        codes = []
        for method in ("/openengine.v1.OpenEngine/Abort", "/openengine.v1.Control/Abort"):
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await running.channel.unary_unary(method)(abort)
            codes.append((missing.value.code(), missing.value.details()))
        plain = _request("plain").SerializeToString()  # no field that differs: the same request in both layouts
        seed_stream = await _raw_stream(running.channel, "/openengine.v1.OpenEngine/Generate", plain)
        later_stream = await _raw_stream(running.channel, "/openengine.v1.Inference/Generate", plain)
    assert codes[0] == codes[1] and codes[0][0] is grpc.StatusCode.NOT_FOUND
    assert pb.GenerateResponse.FromString(seed_stream[-1]).usage.total_tokens == 14
    assert pb_later.GenerateResponse.FromString(later_stream[-1]).usage.total_tokens == 14


# -- health, reflection, scopes ------------------------------------------------------------------


async def test_health_knows_every_served_service() -> None:
    async with later() as (running, _inference, _control):
        health = health_pb2_grpc.HealthStub(running.channel)
        for _ in range(100):
            answers = [
                (await health.Check(health_pb2.HealthCheckRequest(service=name))).status for name in SERVED_SERVICES
            ]
            if set(answers) == {health_pb2.HealthCheckResponse.SERVING}:
                break
            await asyncio.sleep(0.05)
    assert set(answers) == {health_pb2.HealthCheckResponse.SERVING}
    assert {"openengine.v1.Inference", "openengine.v1.Control", "openengine.v1.OpenEngine"} <= set(SERVED_SERVICES)


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_lists_and_describes_both_layouts(version: str) -> None:
    method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="openengine.v1.Control"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="openengine.v1.OpenEngine"),
    ]
    async with later() as (running, _inference, _control):
        call = running.channel.stream_stream(
            method,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = [answer async for answer in call(iter(requests))]
    listed = {service.name for service in answers[0].list_services_response.service}
    assert set(SERVED_SERVICES) | {"grpc.reflection.v1.ServerReflection"} <= listed
    from google.protobuf import descriptor_pb2

    def files(answer: reflection_pb2.ServerReflectionResponse) -> dict[str, descriptor_pb2.FileDescriptorProto]:
        protos = [
            descriptor_pb2.FileDescriptorProto.FromString(d)
            for d in answer.file_descriptor_response.file_descriptor_proto
        ]
        return {proto.name: proto for proto in protos}

    later_files = files(answers[1])
    seed_files = files(answers[2])
    assert "openengine_later/v1/openengine.proto" in later_files and "openengine_later/v1/server.proto" in later_files
    control = later_files["openengine_later/v1/openengine.proto"].service[1]
    assert control.name == "Control" and "GetServerInfo" in [m.name for m in control.method]
    assert "openengine/v1/openengine.proto" in seed_files and not any(
        n.startswith("openengine_later") for n in seed_files
    )


async def test_later_rpcs_need_the_seed_rpcs_scopes() -> None:
    options = ServerOptions(auth=TokenAuth(inference=["inf"], observer=["obs"], control=["ctl"]))
    async with serve_backends([("model", mock())], server_options=options) as running:
        control = pb_later.ControlStub(running.channel)
        inference_token = (("authorization", "Bearer inf"),)
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await control.GetServerInfo(pb_later.GetServerInfoRequest())
        info = await control.GetServerInfo(pb_later.GetServerInfoRequest(), metadata=inference_token)
        with pytest.raises(grpc.aio.AioRpcError) as abort_all:
            await control.Abort(pb_later.AbortRequest(all_requests=pb_later.AllRequests()), metadata=inference_token)
        with pytest.raises(grpc.aio.AioRpcError) as observer_generate:
            async for _ in pb_later.InferenceStub(running.channel).Generate(
                _request("obs-1"), metadata=(("authorization", "Bearer obs"),)
            ):
                pass
    assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert info.schema_release == pb_later.SCHEMA_RELEASE
    assert abort_all.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert observer_generate.value.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_an_extra_key_a_driver_accepts_is_answered() -> None:
    async with later() as (running, inference, _control):
        facts = running.gateway.engines.route("model").engines[0].facts
        facts.accepted_extra = frozenset({"speculative_k"})  # what a driver's EngineFacts would say
        accepted = _request("extra-ok")
        accepted.extra.update({"speculative_k": 4})
        events = [event async for event in inference.Generate(accepted)]
        other = _request("extra-other")
        other.extra.update({"speculative_k": 4, "draft_model": "d"})
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in inference.Generate(other):
                pass
    assert events[-1].finished.reason == pb_later.FINISH_REASON_LENGTH
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "extra.draft_model" in refused.value.details()
