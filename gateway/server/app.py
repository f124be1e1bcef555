"""The grpc.aio server: OpenEngine, grpc.health.v1 and reflection on one port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .. import pb
from ..core.gateway import Gateway
from .servicer import OpenEngineServicer

log = logging.getLogger(__name__)

_HEALTH_POLL_S = 1.0
_CLOSE_GRACE_S = 2.0
"""Time for aborted streams to flush their terminal events before connections close."""


@dataclass(frozen=True)
class ServerOptions:
    """Where and how the gRPC server listens."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_message_bytes: int = 64 * 1024 * 1024


class GatewayServer:
    """Serves a ``Gateway`` over gRPC until stopped."""

    def __init__(self, gateway: Gateway, options: ServerOptions = ServerOptions()) -> None:
        self.gateway = gateway
        self.options = options
        self.port = 0
        self._server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", options.max_message_bytes),
                ("grpc.max_send_message_length", options.max_message_bytes),
            ]
        )
        pb.add_OpenEngineServicer_to_server(OpenEngineServicer(gateway), self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (pb.SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self._health_task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        """``host:port`` as bound (the port resolved when 0 was asked for)."""
        host = self.options.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind and start serving; raises ``OSError`` when the address cannot be bound."""
        host = self.options.host
        target = f"[{host}]:{self.options.port}" if ":" in host else f"{host}:{self.options.port}"
        try:
            self.port = self._server.add_insecure_port(target)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {target}: {exc}") from None
        await self._server.start()
        self.gateway.start()
        self._health_task = asyncio.create_task(self._publish_health())

    async def _publish_health(self) -> None:
        """Mirror the OpenEngine health state into grpc.health.v1 (SERVING only when READY)."""
        while True:
            try:
                state = (await self.gateway.lifecycle.health(pb.HealthRequest())).state
            except Exception:  # broad on purpose: a failing check means NOT_SERVING, not a dead loop
                log.exception("health check failed")
                state = pb.HEALTH_STATE_NOT_READY
            serving = (
                health_pb2.HealthCheckResponse.SERVING
                if state in (pb.HEALTH_STATE_READY, pb.HEALTH_STATE_DEGRADED)
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for service in ("", pb.SERVICE_NAME):
                await self._health.set(service, serving)
            await asyncio.sleep(_HEALTH_POLL_S)

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Drain: refuse new requests, let running ones finish for up to ``drain_timeout_s``,
        abort the rest with their terminal events, then close the server and the engines."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self._health.enter_graceful_shutdown()
        await self.gateway.settle(drain_timeout_s)
        await self._server.stop(_CLOSE_GRACE_S)
        await self.gateway.stop()

    async def wait_for_termination(self) -> None:
        """Block until the server has stopped."""
        await self._server.wait_for_termination()


__all__ = ["GatewayServer", "ServerOptions"]
