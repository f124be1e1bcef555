"""The gateway's own Routes service over real gRPC with tokens: GetRoutes for any valid token,
ReloadRoutes for a control token only, a refused reload FAILED_PRECONDITION with its reason."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from openengine_gateway import routes_pb
from openengine_gateway.config import SplitSection, load_config
from openengine_gateway.core.gateway import Gateway
from openengine_gateway.engines import Engine, EngineSet
from openengine_gateway.reload import RouteReloader
from openengine_gateway.server.app import GatewayServer, ServerOptions
from openengine_gateway.server.auth import TokenAuth
from openengine_gateway.testing import serve_backends

from tests.ops.support import mock

INFERENCE, CONTROL, OBSERVER = "inference-token-1", "control-token-1", "observer-token-1"
AUTH = TokenAuth([("tenant", INFERENCE)], [("operator", CONTROL)], [("watcher", OBSERVER)])
SPLIT = '[[splits]]\nname = "ab"\nengines = {{ a = {a}, b = {b} }}\n'


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@contextlib.asynccontextmanager
async def served(config_file: Path) -> AsyncIterator[routes_pb.RoutesStub]:
    """Mock engines ``a`` and ``b`` served with tokens, their routes from ``config_file`` and reloadable from it."""
    config = load_config(config_file)
    engines = []
    for name in ("a", "b"):
        backend = mock()
        engines.append(Engine(name, (), backend, await backend.start()))
    gateway = Gateway(EngineSet(engines), splits=config.splits, mirrors=config.mirrors)
    reloader = RouteReloader(gateway, config_file, config, command_line=True)
    server = GatewayServer(gateway, ServerOptions(port=0, auth=AUTH), reloader)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield routes_pb.RoutesStub(channel)
    finally:
        await server.stop(0)


async def test_any_token_reads_the_routes_and_a_control_token_reloads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = tmp_path / "plugins.toml"
    config.write_text(SPLIT.format(a=3, b=1) + '[[mirrors]]\nname = "a"\nshadow = "b"\npercent = 25\n')
    async with served(config) as stub:
        for token in (INFERENCE, OBSERVER, CONTROL):
            routes = await stub.GetRoutes(routes_pb.GetRoutesRequest(), metadata=bearer(token))
            (split,) = routes.splits
            assert split.name == "ab" and list(split.sticky) == ["metadata.session", "cache_salt"]
            assert [(e.engine, e.weight) for e in split.engines] == [("a", 3), ("b", 1)]
            assert [(m.name, m.shadow, m.percent, m.max_in_flight) for m in routes.mirrors] == [("a", "b", 25, 32)]
        config.write_text(SPLIT.format(a=1, b=1))
        for token in (INFERENCE, OBSERVER):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ReloadRoutes(routes_pb.ReloadRoutesRequest(), metadata=bearer(token))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await stub.GetRoutes(routes_pb.GetRoutesRequest())
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reloaded = await stub.ReloadRoutes(routes_pb.ReloadRoutesRequest(), metadata=bearer(CONTROL))
        assert list(reloaded.changes) == ["split 'ab': weight of a 3 -> 1", "mirror 'a' -> 'b' removed"]
        assert [(e.engine, e.weight) for e in reloaded.routes.splits[0].engines] == [("a", 1), ("b", 1)]
        assert reloaded.routes == await stub.GetRoutes(routes_pb.GetRoutesRequest(), metadata=bearer(INFERENCE))
    audit = [r.getMessage() for r in caplog.records if r.name == "openengine_gateway.audit"]
    denied = [line for line in audit if line.startswith("audit: PERMISSION_DENIED on ReloadRoutes by ")]
    assert [line.split(" by ")[1].split(" from ")[0] for line in denied] == ["token 'tenant'", "token 'watcher'"]
    assert any(
        line.startswith(f"audit: reload of routes from {config}: split 'ab'") and "by token 'operator' from" in line
        for line in audit
    ), audit


async def test_a_refused_reload_is_failed_precondition_and_leaves_the_routes(tmp_path: Path) -> None:
    config = tmp_path / "plugins.toml"
    config.write_text(SPLIT.format(a=3, b=1))
    async with served(config) as stub:
        before = await stub.GetRoutes(routes_pb.GetRoutesRequest(), metadata=bearer(CONTROL))
        config.write_text(SPLIT.format(a=3, b=1).replace("b = 1", "nope = 1"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReloadRoutes(routes_pb.ReloadRoutesRequest(), metadata=bearer(CONTROL))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (refused.value.details() or "").startswith("routes not reloaded: ")
        assert "nope" in (refused.value.details() or "")
        assert await stub.GetRoutes(routes_pb.GetRoutesRequest(), metadata=bearer(CONTROL)) == before


async def test_a_gateway_without_a_configuration_file_serves_its_routes_and_refuses_a_reload() -> None:
    split = SplitSection(name="ab", engines={"a": 1, "b": 2})
    async with serve_backends([("a", mock()), ("b", mock())], splits=[split]) as running:
        stub = routes_pb.RoutesStub(running.channel)
        routes = await stub.GetRoutes(routes_pb.GetRoutesRequest())
        assert [(e.engine, e.weight) for e in routes.splits[0].engines] == [("a", 1), ("b", 2)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReloadRoutes(routes_pb.ReloadRoutesRequest())
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "started without a configuration file" in (refused.value.details() or "")
