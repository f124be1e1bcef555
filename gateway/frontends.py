"""``--frontends N``: N gateway processes on one address in front of engines started once.

The command becomes a supervisor. It validates everything and holds the ports as a single gateway
does, refuses a backend that cannot be shared (``Backend.share``) before anything starts, starts
each engine once (``spi.frontends``), then spawns N frontend processes. Each runs the ordinary
gateway (``cli.serve`` with its ``Frontend``): it attaches to the engines instead of starting them,
binds the gRPC port with ``SO_REUSEPORT`` (the kernel spreads connections over the processes), and
serves ``Peers`` on a unix socket in the supervisor's private directory, through which it reaches
its siblings (``core.peers``). The supervisor serves the metrics port, merging the frontends' pages
(``server.merged_metrics``).

Signals: SIGINT or SIGTERM to the supervisor drains every frontend (SIGTERM to each; a frontend
ignores a terminal's SIGINT and waits for that), then stops the engines; a second one stops them at
once. SIGHUP reaches every frontend (each reloads its routes). A frontend that exits on its own
stops the rest, and the supervisor exits 1. A frontend whose supervisor dies drains and exits
(``watch_supervisor``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import secrets
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import CollectorRegistry

from .config import Config, EngineSection
from .core.gateway import Gateway, GatewayOptions
from .engines import EngineSet
from .errors import ConfigurationError, EngineStartError, SetupError
from .launch import plan_engines
from .reload import RouteReloader
from .server.app import ServerOptions, reserved, serving_line
from .server.merged_metrics import MergedCollector
from .server.metrics import MetricsServer
from .server.peers import PeerClients, PeerServer, fetch_metrics
from .spi.backend import Backend
from .spi.frontends import SharedEngine

log = logging.getLogger("openengine_gateway")

STARTUP_TIMEOUT_S = 600.0
"""How long frontends may take to attach and serve once the engines have started."""
STOP_GRACE_S = 15.0
"""Time a frontend gets past its drain timeout to exit before it is killed."""


@dataclass(frozen=True)
class Frontend:
    """What frontend process ``index`` of ``count`` is handed (through multiprocessing's spawn)."""

    index: int
    count: int
    port: int
    """The gRPC port every frontend binds (resolved by the supervisor when 0 was asked for)."""
    attachments: tuple[object, ...]
    """Per engine, in configuration order: its ``Backend.attach`` value."""
    sockets: tuple[str, ...]
    """Every frontend's ``Peers`` socket, by index."""
    token: str
    """The supervisor's secret that every ``Peers`` call carries."""
    instance_id: str
    """The endpoint's instance id when it serves several engines (one engine: the engine's own)."""
    ready: Connection
    """Where this frontend reports that it serves."""

    def server_options(self, options: ServerOptions) -> ServerOptions:
        """The gRPC port shared with the siblings; no metrics port (the supervisor serves it)."""
        return dataclasses.replace(options, port=self.port, reuse_port=True, metrics_port=None)

    def gateway_options(self, options: GatewayOptions, engines: EngineSet) -> GatewayOptions:
        """Every frontend reports the same instance id."""
        if options.instance_id or len(engines) == 1:
            return options
        return options.model_copy(update={"instance_id": self.instance_id})

    def siblings(self) -> PeerClients:
        """The other frontends' ``Peers``."""
        paths = [path for index, path in enumerate(self.sockets) if index != self.index]
        return PeerClients(paths, self.token, f"frontend {self.index + 1} of {self.count}, pid {os.getpid()}")

    async def serve_peers(self, gateway: Gateway, reloader: RouteReloader, registry: CollectorRegistry) -> PeerServer:
        """Serve ``Peers`` on this frontend's socket, then tell the supervisor it serves."""
        server = PeerServer(gateway, reloader, registry, self.sockets[self.index], self.token)
        await server.start()
        self.ready.send(os.getpid())
        self.ready.close()
        return server


def run_frontend(args: argparse.Namespace, extra: Sequence[str], frontend: Frontend) -> None:
    """A frontend process's entry point: the ordinary gateway, attached (``cli.serve``)."""
    from .cli import report_failure, run_serve

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the supervisor sends SIGTERM
    try:
        code = run_serve(args, extra, frontend)
    except (SetupError, OSError) as exc:
        code = report_failure(exc)
    sys.exit(code)


def watch_supervisor(on_gone: Callable[[], None]) -> None:
    """In a frontend: call ``on_gone`` (on the running loop) once the supervisor dies. Killed outright,
    the supervisor cannot stop its frontends, which would otherwise serve on, orphaned, until someone
    kills them."""
    supervisor = multiprocessing.parent_process()
    if supervisor is None:
        return
    loop = asyncio.get_running_loop()

    def gone() -> None:
        loop.remove_reader(supervisor.sentinel)
        log.warning("the supervisor (pid %s) is gone: draining, then stopping", supervisor.pid)
        on_gone()

    loop.add_reader(supervisor.sentinel, gone)


async def supervise(
    args: argparse.Namespace,
    extra: Sequence[str],
    config: Config,
    sections: Sequence[EngineSection],
    options: ServerOptions,
    *,
    count: int,
    drain_timeout_s: float,
    command_line: bool,
    gateway_flags: Sequence[str],
) -> int:
    """Start the engines once, run ``count`` frontends until a signal or one's exit; the exit status."""
    plans = plan_engines(sections, config, command_line=command_line, gateway_flags=gateway_flags)
    for plan in plans:
        if not type(plan.backend).can_share():
            raise ConfigurationError(
                f"{plan.label}: backend {plan.section.backend!r} cannot serve from several frontend processes "
                f"(--frontends {count}); serve it with --frontends 1"
            )
    supervisor = _Supervisor(count, drain_timeout_s)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, supervisor.on_stop_signal, signum)
    loop.add_signal_handler(signal.SIGHUP, supervisor.forward, signal.SIGHUP)
    engines: list[SharedEngine] = []
    with contextlib.ExitStack() as running:
        directory = running.enter_context(tempfile.TemporaryDirectory(prefix="oe-frontends-"))
        sockets = tuple(os.path.join(directory, f"frontend-{index}.sock") for index in range(count))
        token = secrets.token_urlsafe(32)
        try:
            with reserved(dataclasses.replace(options, reuse_port=True)) as held:  # until every frontend listens
                for plan in plans:
                    engines.append(await _share(plan.backend, f"{plan.served_name!r} ({plan.section.backend})", count))
                if supervisor.stopping:
                    return 0
                supervisor.spawn(args, extra, held.port, engines, sockets, token)
                for engine in engines:
                    await asyncio.to_thread(engine.frontends_started)
                if not await supervisor.wait_ready():
                    return supervisor.exit_code()
                if held.metrics_port is not None:
                    registry = CollectorRegistry(auto_describe=False)
                    registry.register(MergedCollector([partial(fetch_metrics, path, token) for path in sockets]))
                    metrics = MetricsServer(registry)
                    running.callback(metrics.stop)
                    held = dataclasses.replace(
                        held,
                        metrics_port=metrics.start(
                            held.metrics_host, held.metrics_port, held.tls if held.metrics_tls else None
                        ),
                    )
            names = ", ".join(plan.served_name for plan in plans)
            line = serving_line(names, held, held.port, held.metrics_port, f", {count} frontends")
            print(line, flush=True)
            await supervisor.wait_exit()
            return supervisor.exit_code()
        finally:
            await supervisor.stop_all()
            for engine in reversed(engines):
                await asyncio.to_thread(engine.stop)
            log.info("stopped")


async def _share(backend: Backend[Any], name: str, count: int) -> SharedEngine:
    """``backend``'s engine started for ``count`` frontends (in a thread: it blocks)."""
    log.info("starting engine %s, shared by %d frontends", name, count)
    try:
        return await asyncio.to_thread(type(backend).share, backend.settings, count)
    except (ConfigurationError, OSError):
        raise  # the user's to fix, reported as a usage error
    except Exception as exc:
        raise EngineStartError(f"engine {name} failed to start: {type(exc).__name__}: {exc}") from exc


class _Supervisor:
    """The frontend processes: spawning, readiness, signals, exits."""

    def __init__(self, count: int, drain_timeout_s: float) -> None:
        self._count = count
        self._drain_timeout_s = drain_timeout_s
        self._processes: list[BaseProcess] = []
        self._ready: list[Connection] = []
        self._stop = asyncio.Event()
        self._signals = 0
        self._failed = False

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def on_stop_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("%s: draining every frontend, then stopping", signal.Signals(signum).name)
        else:
            log.warning("second %s: stopping every frontend now", signal.Signals(signum).name)
        self.forward(signal.SIGTERM)  # a frontend's second SIGTERM stops it at once
        self._stop.set()

    def forward(self, signum: int) -> None:
        for process in self._processes:
            if process.pid is not None and process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def spawn(
        self,
        args: argparse.Namespace,
        extra: Sequence[str],
        port: int,
        engines: Sequence[SharedEngine],
        sockets: tuple[str, ...],
        token: str,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        instance_id = uuid.uuid4().hex
        for index in range(self._count):
            reader, writer = context.Pipe(duplex=False)
            frontend = Frontend(
                index,
                self._count,
                port,
                tuple(engine.attachments[index] for engine in engines),
                sockets,
                token,
                instance_id,
                writer,
            )
            process = context.Process(
                target=run_frontend, args=(args, list(extra), frontend), name=f"openengine-frontend-{index}"
            )
            process.start()
            writer.close()
            self._processes.append(process)
            self._ready.append(reader)

    async def wait_ready(self) -> bool:
        """Until every frontend serves (True), or one exits or a signal comes first (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        waiting = set(range(self._count))
        while waiting:
            for index in list(waiting):
                reader = self._ready[index]
                with contextlib.suppress(EOFError, OSError):
                    if reader.poll():
                        reader.recv()
                        waiting.discard(index)
                if self._processes[index].exitcode is not None:
                    log.error("frontend %d exited (%s) before serving", index, self._processes[index].exitcode)
                    self._failed = True
                    return False
            if self._stop.is_set():
                return False
            if loop.time() > deadline:
                log.error("frontends did not serve within %gs", STARTUP_TIMEOUT_S)
                self._failed = True
                return False
            if waiting:
                await asyncio.sleep(0.1)
        return True

    async def wait_exit(self) -> None:
        """Until a signal, or until a frontend exits on its own (a failure)."""
        while not self._stop.is_set():
            for index, process in enumerate(self._processes):
                if process.exitcode is not None:
                    log.error("frontend %d exited (%s): stopping the others", index, process.exitcode)
                    self._failed = True
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.2)

    async def stop_all(self) -> None:
        """SIGTERM every running frontend and wait for them (killing one past the drain and a grace)."""
        if not self._stop.is_set():  # a frontend failed: the others drain too
            self.forward(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_timeout_s + STOP_GRACE_S
        for process in self._processes:
            await asyncio.to_thread(process.join, max(0.0, deadline - loop.time()))
            if process.exitcode is None:
                log.warning("frontend %s did not exit: killing it", process.name)
                process.kill()
                await asyncio.to_thread(process.join, 5)
            elif process.exitcode != 0:
                self._failed = True
        for reader in self._ready:
            reader.close()

    def exit_code(self) -> int:
        return 1 if self._failed else 0


__all__ = ["Frontend", "run_frontend", "supervise", "watch_supervisor"]
