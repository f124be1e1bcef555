"""Tokens, scopes, TLS and mutual TLS over real sockets, for every RPC.

A gateway with an inference, an observer and a control token: without a valid token every call
is UNAUTHENTICATED; the inference token reaches every inference and discovery RPC and is
PERMISSION_DENIED on the event streams and the control ones (Abort of all requests, Drain, LoRA
load/unload); the observer token reaches discovery and the event streams only; the control
token reaches everything. grpc.health.v1 stays open for probes; reflection needs a token. No token reaches
a log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth
from openengine_gateway.server.tls import TlsFiles

from tests.ops.certs import Certificates
from tests.ops.conftest import Figures
from tests.ops.support import CALLS, gateway, outcome

INFERENCE = "inference-token-0123456789"
CONTROL = "control-token-9876543210"
OBSERVER = "observer-token-5647382910"
REFUSED = {"UNAUTHENTICATED", "PERMISSION_DENIED"}


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def tokens() -> ServerOptions:
    return ServerOptions(auth=TokenAuth([INFERENCE], [CONTROL], [OBSERVER]))


async def test_every_rpc_without_a_valid_token_is_unauthenticated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    caplog.set_level(logging.DEBUG)
    presented = [(), bearer("wrong"), (("authorization", f"Basic {INFERENCE}"),), bearer(INFERENCE + "x")]
    async with gateway(server=tokens()) as running:
        for metadata in presented:
            for call in CALLS:
                assert await outcome(running.stub, call, tmp_path, metadata=metadata) == "UNAUTHENTICATED", call.label
        assert len(running.gateway.registry) == 0
    figures.record("auth: calls refused without a valid token", len(presented) * len(CALLS))
    assert INFERENCE not in caplog.text and CONTROL not in caplog.text


async def test_the_inference_scope_reaches_inference_rpcs_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateway(server=tokens()) as running:
        for call in CALLS:
            code = await outcome(running.stub, call, tmp_path, metadata=bearer(INFERENCE))
            if call.control or call.observe:
                assert code == "PERMISSION_DENIED", call.label
            else:
                assert code not in REFUSED, (call.label, code)
        assert not running.gateway.state.draining
    assert INFERENCE not in caplog.text
    assert "audit: PERMISSION_DENIED on Drain by token 'inference-1' from ipv4:127.0.0.1:" in caplog.text


async def test_the_observer_scope_reaches_discovery_and_the_event_streams_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateway(server=tokens()) as running:
        for call in CALLS:
            code = await outcome(running.stub, call, tmp_path, metadata=bearer(OBSERVER))
            if call.observe or call.discovery:
                assert code not in REFUSED, (call.label, code)
            else:
                assert code == "PERMISSION_DENIED", call.label
        assert len(running.gateway.registry) == 0 and not running.gateway.state.draining
    assert OBSERVER not in caplog.text


async def test_the_control_scope_reaches_every_rpc(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateway(server=tokens()) as running:
        codes = {call.label: await outcome(running.stub, call, tmp_path, metadata=bearer(CONTROL)) for call in CALLS}
    assert not REFUSED & set(codes.values()), codes
    assert codes["LoadLora"] == "OK" and codes["UnloadLora"] == "OK" and codes["Drain"] == "OK"
    assert CONTROL not in caplog.text


async def test_every_call_is_checked_after_the_method_has_served_one(tmp_path: Path) -> None:
    # the interceptor builds each method's relaying handler once: a later call must still be checked
    async with gateway(server=tokens()) as running:
        for call in CALLS:
            assert await outcome(running.stub, call, tmp_path, metadata=bearer(CONTROL)) not in REFUSED, call.label
            assert await outcome(running.stub, call, tmp_path) == "UNAUTHENTICATED", call.label
            expected = "PERMISSION_DENIED" if call.control or call.observe else None
            code = await outcome(running.stub, call, tmp_path, metadata=bearer(INFERENCE))
            assert code == expected if expected else code not in REFUSED, (call.label, code)


async def test_one_token_closes_control_too(tmp_path: Path) -> None:
    """With no control token, control RPCs fall back to the inference tokens, never open."""
    async with gateway(server=ServerOptions(auth=TokenAuth([INFERENCE]))) as running:
        for call in CALLS:
            assert await outcome(running.stub, call, tmp_path) == "UNAUTHENTICATED", call.label
            assert await outcome(running.stub, call, tmp_path, metadata=bearer(INFERENCE)) not in REFUSED


async def test_health_probes_need_no_token_and_reflection_does() -> None:
    async with gateway(server=tokens()) as running:
        probe = health_pb2_grpc.HealthStub(running.channel)
        answer = await probe.Check(health_pb2.HealthCheckRequest(service=pb.SERVICE_NAME))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(running.channel)
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in reflection.ServerReflectionInfo(iter([listing])):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        responses = [r async for r in reflection.ServerReflectionInfo(iter([listing]), metadata=bearer(INFERENCE))]
    services = {s.name for s in responses[0].list_services_response.service}
    assert pb.SERVICE_NAME in services


async def test_tls_serves_every_rpc_and_refuses_plaintext(tmp_path: Path, certificates: Certificates) -> None:
    tls = TlsFiles(certificates.server.cert_file, certificates.server.key_file)
    trust = grpc.ssl_channel_credentials(root_certificates=certificates.ca.cert)
    options = ServerOptions(tls=tls, auth=TokenAuth([INFERENCE], [CONTROL]))
    async with gateway(server=options, credentials=trust) as running:
        codes = {call.label: await outcome(running.stub, call, tmp_path, metadata=bearer(CONTROL)) for call in CALLS}
        assert not REFUSED & set(codes.values()) and "UNAVAILABLE" not in codes.values(), codes
        async with grpc.aio.insecure_channel(running.address) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb.OpenEngineStub(plaintext).Health(pb.HealthRequest(), metadata=bearer(CONTROL), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("client", ["signed", "none", "rogue"])
async def test_mutual_tls_admits_only_clients_signed_by_the_client_ca(
    client: str, tmp_path: Path, certificates: Certificates
) -> None:
    tls = TlsFiles(certificates.server.cert_file, certificates.server.key_file, certificates.ca.cert_file)
    pair = {"signed": certificates.client, "none": None, "rogue": certificates.rogue}[client]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certificates.ca.cert,
        private_key=pair.key if pair else None,
        certificate_chain=pair.cert if pair else None,
    )
    async with gateway(server=ServerOptions(tls=tls), credentials=credentials, options=GatewayOptions()) as running:
        codes = {call.label: await outcome(running.stub, call, tmp_path) for call in CALLS}
    if client == "signed":
        assert "UNAVAILABLE" not in codes.values() and not REFUSED & set(codes.values()), codes
    else:
        assert set(codes.values()) == {"UNAVAILABLE"}, codes


def test_bad_tls_files_are_refused_before_any_engine_starts(certificates: Certificates, tmp_path: Path) -> None:
    """grpc reports a bad certificate or key only as a failed bind: the gateway names the files first."""
    good = TlsFiles(certificates.server.cert_file, certificates.server.key_file, certificates.ca.cert_file)
    good.check()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    for files, names in (
        (TlsFiles(certificates.server.cert_file, certificates.client.key_file), "not a PEM certificate chain"),
        (TlsFiles(garbage, certificates.server.key_file), "garbage.pem"),
        (TlsFiles(certificates.server.cert_file, certificates.server.key_file, garbage), "not a PEM client CA"),
    ):
        with pytest.raises(OSError, match=names):
            files.check()


def _audit(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "openengine_gateway.audit" and r.levelno == logging.INFO
    ]


async def test_every_call_that_changes_what_all_clients_see_is_audited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Drain, LoadLora, UnloadLora, Abort of all requests and every PERMISSION_DENIED: one INFO
    line each, naming the token by its name and the peer, never the token."""
    caplog.set_level(logging.INFO)
    auth = TokenAuth([("tenant", INFERENCE)], [("operator", CONTROL)])
    async with gateway(server=ServerOptions(auth=auth)) as running:
        for call in CALLS:
            if call.control:
                await outcome(running.stub, call, tmp_path, metadata=bearer(CONTROL))
        await outcome(running.stub, CALLS[[c.rpc for c in CALLS].index("Drain")], tmp_path, metadata=bearer(INFERENCE))
    lines = _audit(caplog)
    operator = [line for line in lines if "by token 'operator' from ipv4:127.0.0.1:" in line]
    for action in ("Abort(all_requests) of 0 requests", "Drain (", "LoadLora of 'ops-adapter'", "UnloadLora of"):
        assert sum(line.startswith(f"audit: {action}") for line in operator) == 1, (action, lines)
    assert any(
        line.startswith("audit: PERMISSION_DENIED on Drain by token 'tenant' from ipv4:127.0.0.1:") for line in lines
    ), lines
    assert INFERENCE not in caplog.text and CONTROL not in caplog.text


async def test_without_tokens_the_audit_names_the_client_certificate(
    tmp_path: Path, certificates: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    tls = TlsFiles(certificates.server.cert_file, certificates.server.key_file, certificates.ca.cert_file)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certificates.ca.cert,
        private_key=certificates.client.key,
        certificate_chain=certificates.client.cert,
    )
    async with gateway(server=ServerOptions(tls=tls), credentials=credentials) as running:
        await running.stub.Abort(pb.AbortRequest(all_requests=pb.AllRequests()))
    assert any(
        line.startswith("audit: Abort(all_requests) of 0 requests by certificate ") and "client" in line
        for line in _audit(caplog)
    ), _audit(caplog)
