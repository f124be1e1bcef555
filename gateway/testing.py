"""Run a gateway in process over real gRPC, for tests (ours and plugin authors').

    async with serve_backends([("mock", MockBackend(MockBackend.Settings()))]) as running:
        async for response in running.stub.Generate(request):
            ...

Backends are started, served on a free loopback port, and stopped on exit; ``running.gateway``
gives access to the core (registry, hubs) for assertions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from . import pb
from .config import MirrorSection, SplitSection
from .core.gateway import Gateway, GatewayOptions
from .engines import Engine, EngineSet, check_exclusive
from .server.app import GatewayServer, ServerOptions
from .spi.backend import Backend


@dataclass
class RunningGateway:
    """A started in-process gateway and a connected client stub."""

    server: GatewayServer
    channel: grpc.aio.Channel
    stub: pb.OpenEngineStub

    @property
    def gateway(self) -> Gateway:
        """The gateway core behind the server."""
        return self.server.gateway

    @property
    def address(self) -> str:
        """``host:port`` the server listens on."""
        return self.server.address


@contextlib.asynccontextmanager
async def serve_backends(
    backends: Sequence[tuple[str, Backend[Any]]] | Sequence[tuple[str, Backend[Any], Sequence[str]]],
    *,
    options: GatewayOptions = GatewayOptions(),
    host: str = "127.0.0.1",
    server_options: ServerOptions | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    splits: Sequence[SplitSection] = (),
    mirrors: Sequence[MirrorSection] = (),
) -> AsyncIterator[RunningGateway]:
    """Start ``(served_name, backend[, aliases])`` engines and serve them on a free port.

    ``server_options`` (its host and port are replaced) turn on TLS, tokens or metrics;
    ``credentials`` make ``running.stub`` a TLS channel (a plaintext one otherwise); ``splits``
    and ``mirrors`` are the ``[[splits]]``/``[[mirrors]]`` tables (``running.gateway.reroute``
    changes them while serving).
    """
    check_exclusive([(entry[0], entry[1]) for entry in backends])
    engines: list[Engine] = []
    started: list[Backend[Any]] = []  # including one whose facts are then refused
    try:
        for entry in backends:
            name, backend = entry[0], entry[1]
            aliases = tuple(entry[2]) if len(entry) > 2 else ()
            facts = await backend.start()
            started.append(backend)
            engines.append(Engine(name, aliases, backend, facts))
        served = dataclasses.replace(server_options or ServerOptions(), host=host, port=0)
        gateway = Gateway(EngineSet(engines), options, splits=splits, mirrors=mirrors)
        server = GatewayServer(gateway, served)
        await server.start()
    except BaseException:
        for backend in started:
            await backend.stop()
        raise
    channel = (
        grpc.aio.insecure_channel(server.address)
        if credentials is None
        else grpc.aio.secure_channel(server.address, credentials)
    )
    try:
        yield RunningGateway(server, channel, pb.OpenEngineStub(channel))
    finally:
        await channel.close()
        await server.stop(0)


__all__ = ["RunningGateway", "serve_backends"]
