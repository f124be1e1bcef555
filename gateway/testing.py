"""Run a gateway in process over real gRPC, for tests (ours and plugin authors').

    async with serve_backends([("mock", MockBackend(MockBackend.Settings()))]) as running:
        async for response in running.stub.Generate(request):
            ...

Backends are started, served on a free loopback port, and stopped on exit; ``running.gateway``
gives access to the core (registry, hubs) for assertions.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from . import pb
from .core.gateway import Gateway, GatewayOptions
from .engines import Engine, EngineSet
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
    backends: Sequence[tuple[str, Backend]] | Sequence[tuple[str, Backend, Sequence[str]]],
    *,
    options: GatewayOptions = GatewayOptions(),
    host: str = "127.0.0.1",
) -> AsyncIterator[RunningGateway]:
    """Start ``(served_name, backend[, aliases])`` engines and serve them on a free port."""
    engines: list[Engine] = []
    started: list[Backend] = []  # including one whose facts are then refused
    try:
        for entry in backends:
            name, backend = entry[0], entry[1]
            aliases = tuple(entry[2]) if len(entry) > 2 else ()  # type: ignore[misc]
            facts = await backend.start()
            started.append(backend)
            engines.append(Engine(name, aliases, backend, facts))
        server = GatewayServer(Gateway(EngineSet(engines), options), ServerOptions(host=host, port=0))
        await server.start()
    except BaseException:
        for backend in started:
            await backend.stop()
        raise
    channel = grpc.aio.insecure_channel(server.address)
    try:
        yield RunningGateway(server, channel, pb.OpenEngineStub(channel))
    finally:
        await channel.close()
        await server.stop(0)


__all__ = ["RunningGateway", "serve_backends"]
