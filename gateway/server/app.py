"""The grpc.aio server: OpenEngine in both layouts (the seed's ``OpenEngine``, the later ``Inference`` and
``Control``), the gateway's own Routes, grpc.health.v1 and reflection (v1 and v1alpha) on one port.

Plaintext or TLS (mutual with a client CA), bearer tokens and per-RPC counts through one
interceptor (``interceptor``), and Prometheus metrics on a port of their own (``metrics``).
grpc.health.v1 reports NOT_SERVING until the gateway admits requests and every engine's
first check says READY or DEGRADED, while any engine is not, and from the start of a drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .. import logs, pb, pb_later, routes_pb
from ..config import Config
from ..core.gateway import Gateway
from ..reload import RouteReloader
from .auth import TokenAuth
from .health_watch import BoundedHealthServicer
from .interceptor import EdgeInterceptor
from .later_servicer import ControlServicer, InferenceServicer
from .metrics import MetricsExporter
from .reflection import enable_reflection
from .routes_servicer import RoutesServicer
from .servicer import OpenEngineServicer
from .tls import TlsFiles

_HEALTH_POLL_S = 0.25
"""How often the grpc.health.v1 mirror reads the gateway's cached state (no engine call)."""
_CLOSE_GRACE_S = 2.0
"""Time for aborted streams to flush their terminal events before connections close."""


def transport_limit(max_message_bytes: int) -> int:
    """What grpc itself receives: a quarter more than the gateway's limit (at least 64 KiB more),
    so that an oversized request reaches the gateway's check, which counts and logs it. Only a
    request past this is refused by grpc, unseen."""
    return max_message_bytes + max(64 * 1024, max_message_bytes // 4)


@dataclass(frozen=True)
class ServerOptions:
    """Where and how the gRPC server listens."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest request or response; a larger request is RESOURCE_EXHAUSTED, counted and logged
    (the gateway's own check up to ``transport_limit``, gRPC's unseen one past it)."""
    tls: TlsFiles | None = None
    """Serve TLS (mutual TLS with a client CA) instead of plaintext."""
    auth: TokenAuth | None = None
    """Bearer tokens every call must present (``auth``); None = no authentication."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0 picks one); None = no metrics endpoint."""
    metrics_host: str = "127.0.0.1"
    """Address for the metrics endpoint: loopback unless told otherwise, whatever ``host`` is (the
    page names models, token names and load, and takes no token)."""
    metrics_tls: bool = False
    """Serve metrics over HTTPS with ``tls``'s certificate (and its client CA: mutual TLS)."""
    max_streams_per_connection: int = 4096
    """HTTP/2 streams one connection may hold open (SETTINGS_MAX_CONCURRENT_STREAMS): a client past it
    waits for a stream of its own to end. grpc counts a stream the client reset until the server has let
    go of it, so a rapid-reset flood (CVE-2023-44487) holds at most this many places of the queue of calls
    not yet taken, and grpc stops reading the flooding connection instead of cancelling other clients'
    calls."""
    max_health_watches: int = 4096
    """grpc.health.v1 Watch streams open at once (``health_watch``)."""
    max_health_watches_per_connection: int = 16
    """The same, on one connection."""
    reuse_port: bool = False
    """Bind the gRPC port with ``SO_REUSEPORT``, beside the other frontend processes of ``--frontends``
    (the kernel spreads new connections over them)."""


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serving_line(names: str, options: ServerOptions, port: int, metrics_port: int | None, note: str = "") -> str:
    """The startup line the launchers wait for: what serves where (``port`` as bound), in plaintext, TLS or
    mTLS, the metrics port, and ``note`` (the number of frontend processes)."""
    tls = options.tls
    scheme = "plaintext" if tls is None else "mTLS" if tls.mutual else "TLS"
    metrics = f", metrics on port {metrics_port}" if metrics_port is not None else ""
    return f"openengine-gateway serving {names} on {host_port(options.host, port)} ({scheme}{note}{metrics})"


@contextlib.contextmanager
def reserved(options: ServerOptions) -> Iterator[ServerOptions]:
    """Hold the gRPC and metrics ports from now until the block ends; yields ``options`` with each
    port 0 resolved to the one held.

    An engine can take minutes to load: a port already in use is refused here, before it starts.
    Each port is bound (with SO_REUSEADDR) but not listened on, so a client meanwhile is refused
    rather than left waiting, and the server's own bind inside the block takes it over with no
    window for another process to take it (one that also asks SO_REUSEADDR, such as a second
    gateway starting at the same moment, is refused at its own listen instead). Raises
    ``OSError`` naming the address.
    """
    with contextlib.ExitStack() as held:
        port = held.enter_context(_hold(options.host, options.port, "cannot listen on", reuse_port=options.reuse_port))
        metrics_port = options.metrics_port
        if metrics_port is not None:
            metrics_port = held.enter_context(_hold(options.metrics_host, metrics_port, "cannot serve metrics on"))
        yield dataclasses.replace(options, port=port, metrics_port=metrics_port)


@contextlib.contextmanager
def _hold(host: str, port: int, what: str, *, reuse_port: bool = False) -> Iterator[int]:
    """Bind ``host:port`` without listening for the block (with ``SO_REUSEPORT``: so that frontend
    processes bind it beside this socket); yields the bound port."""
    address = f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(f"{what} {address}: {exc.strerror or exc}") from None
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc's and the metrics' listeners do
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(where)
        except OSError as exc:
            raise OSError(f"{what} {address}: {exc.strerror or exc}") from None
        yield int(sock.getsockname()[1])


SERVED_SERVICES = (pb.SERVICE_NAME, *pb_later.SERVICE_NAMES, routes_pb.SERVICE_NAME)
"""Every service this server answers besides health and reflection: the seed layout's, the later layout's
two (``later_servicer``) and the gateway's own; grpc.health.v1 reports on each by name."""

UNLIMITED_INTAKE = 65536
"""Calls gRPC may hold for the gateway when its admission has no limit (``max_in_flight`` unset)."""


def _intake_limits(max_in_flight: int | None, per_connection: int) -> list[tuple[str, int]]:
    """gRPC's bound on calls that arrived but that the server has not yet taken, set to the gateway's own.

    grpc.aio takes one new call per event-loop turn, so a burst waits in gRPC's queue; past its
    default bounds (1,000 soft, 3,000 hard) gRPC cancels new calls, at random and then all of them,
    and a client sees CANCELLED from a gateway that would have admitted it. Bounded at what the
    gateway admits, the one limit a client meets is the gateway's RESOURCE_EXHAUSTED with a retry hint;
    one connection holds at most ``per_connection`` of its places (reset calls included), and as many
    more are kept, so that a connection flooding it (rapid reset) leaves the rest their share.
    """
    limit = max(max_in_flight or UNLIMITED_INTAKE, 1000) + per_connection
    return [("grpc.server.max_pending_requests", limit), ("grpc.server.max_pending_requests_hard_limit", limit)]


class GatewayServer:
    """Serves a ``Gateway`` over gRPC until stopped; ``reloader`` reloads its routes (``ReloadRoutes``;
    None: a gateway started without a configuration file, which refuses a reload)."""

    def __init__(
        self, gateway: Gateway, options: ServerOptions = ServerOptions(), reloader: RouteReloader | None = None
    ) -> None:
        self.gateway = gateway
        self.options = options
        self.port = 0
        self.metrics_port: int | None = None
        self.metrics = MetricsExporter(gateway, options.auth.names if options.auth is not None else ())
        logs.redact_grpc()
        self._server = grpc.aio.server(
            interceptors=[
                EdgeInterceptor(options.auth, self.metrics.rpc_finished, max_request_bytes=options.max_message_bytes)
            ],
            options=[
                ("grpc.so_reuseport", int(options.reuse_port)),
                ("grpc.max_concurrent_streams", options.max_streams_per_connection),
                *_intake_limits(gateway.options.max_in_flight, options.max_streams_per_connection),
                ("grpc.max_receive_message_length", transport_limit(options.max_message_bytes)),
                ("grpc.max_send_message_length", options.max_message_bytes),
            ],
        )
        servicer = OpenEngineServicer(gateway, max_message_bytes=options.max_message_bytes)
        pb.add_OpenEngineServicer_to_server(servicer, self._server)
        pb_later.add_InferenceServicer_to_server(InferenceServicer(servicer, gateway), self._server)
        pb_later.add_ControlServicer_to_server(ControlServicer(servicer, gateway), self._server)
        reloader = reloader or RouteReloader(gateway, None, Config(), command_line=True)
        routes_pb.add_RoutesServicer_to_server(
            RoutesServicer(reloader, gateway.siblings, gateway=gateway), self._server
        )
        self._health = BoundedHealthServicer(
            max_watches=options.max_health_watches,
            max_watches_per_connection=options.max_health_watches_per_connection,
            memory=gateway.registry.memory,
        )
        self.metrics.gauge("health_watches", "Open grpc.health.v1 Watch streams", lambda: self._health.watches)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        enable_reflection(self._server, (*SERVED_SERVICES, health.SERVICE_NAME))
        self._health_task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        """``host:port`` as bound (the port resolved when 0 was asked for)."""
        return host_port(self.options.host, self.port)

    async def start(self) -> None:
        """Bind and start serving; raises ``OSError`` when the address cannot be bound."""
        target = host_port(self.options.host, self.options.port)
        tls = self.options.tls
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(target)
            else:
                self.port = self._server.add_secure_port(target, tls.credentials())
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {target}: {exc}") from None
        if self.options.metrics_port is not None:
            tls = self.options.tls if self.options.metrics_tls else None
            self.metrics_port = self.metrics.start(self.options.metrics_host, self.options.metrics_port, tls)
        await self._publish(serving=False)
        await self._server.start()
        await self.gateway.monitor.poll()  # so the first grpc.health.v1 answer comes from a real check
        self.gateway.start()
        self._health_task = asyncio.create_task(self._publish_health())

    async def _publish_health(self) -> None:
        """Mirror the gateway's state into grpc.health.v1 (SERVING while it admits and engines are ready)."""
        serving: bool | None = None
        while True:
            now = self.gateway.serving
            if now != serving:
                await self._publish(serving=now)
                serving = now
            await asyncio.sleep(_HEALTH_POLL_S)

    async def _publish(self, *, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", *SERVED_SERVICES):
            await self._health.set(service, status)

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
        self.metrics.stop()

    async def wait_for_termination(self) -> None:
        """Block until the server has stopped."""
        await self._server.wait_for_termination()


__all__ = ["GatewayServer", "ServerOptions", "reserved", "transport_limit"]
