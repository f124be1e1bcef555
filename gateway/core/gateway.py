"""The gateway core: the contract applied to a set of started engines.

``Gateway`` composes one service per concern. The transport calls these services and never
reaches a driver directly; the services are the only callers of the backend SPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence

from pydantic import ConfigDict

from .. import pb
from ..config import CoreSettings, MirrorSection, SplitSection
from ..contract.bounds import FieldBounds, advertise_bounds
from ..contract.limits import RequestLimits, advertise_task_limits
from ..engines import EngineSet
from ..errors import ConfigurationError
from ..routes import RouteTable
from .agreement import Agreement
from .background import BackgroundTasks
from .callers import current_caller
from .canary import Canaries
from .discovery import DiscoveryService
from .events import EventService
from .generation import GenerationService
from .lifecycle import LifecycleService
from .lora import LoraRegistry, LoraService
from .memory import MemoryBudget
from .mirror import Mirroring
from .monitor import EngineMonitor
from .peers import PeeredDiscovery, PeeredLifecycle, PeeredLora, Siblings
from .registry import RequestRegistry
from .state import GatewayState
from .tasks import TaskService
from .telemetry import Telemetry
from .unread import UnreadLedger

log = logging.getLogger(__name__)


class GatewayOptions(CoreSettings):
    """What the core applies: its ``[gateway]`` keys (``config.CoreSettings``, where each is declared
    with its default and meaning) and two values the command line resolves rather than takes as set.
    Frozen, so that one instance is a safe default argument."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    advertise_host: str = "127.0.0.1"
    """The routable host advertised in place of a wildcard bind address."""
    instance_id: str = ""
    """EngineInfo/LoadInfo instance id; empty = the engine's own (one engine) or a new uuid."""


class Gateway:
    """Every OpenEngine RPC, engine-neutral, over ``engines``."""

    def __init__(
        self,
        engines: EngineSet,
        options: GatewayOptions = GatewayOptions(),  # noqa: B008 (frozen)
        *,
        splits: Sequence[SplitSection] = (),
        mirrors: Sequence[MirrorSection] = (),
        siblings: Siblings | None = None,
    ) -> None:
        """``siblings``: the other frontend processes in front of these engines (``--frontends``),
        which Abort, Drain, LoRA, GetLoad and ReloadRoutes then reach too (``peers``)."""
        self.engines = engines
        self.siblings = siblings
        self.options = options
        self.state = GatewayState()
        self.registry = RequestRegistry(
            finished_window=options.finished_window,
            max_in_flight=options.max_in_flight,
            max_in_flight_per_owner=options.max_in_flight_per_token,
            memory=MemoryBudget(options.max_memory_mib * 2**20 if options.max_memory_mib is not None else None),
        )
        self.background = BackgroundTasks()
        loras = LoraRegistry(options.lora_roots)
        self.telemetry = Telemetry()
        self.agreement = Agreement()
        limits = RequestLimits(options.max_prompt_chars, options.max_prompt_tokens, options.max_task_items)
        bounds = FieldBounds(**{name: getattr(options, name) for name in FieldBounds.__dataclass_fields__})
        for engine in engines:
            advertise_task_limits(engine.model_info, limits)
            advertise_bounds(engine.model_info, bounds)
        self.canaries = Canaries(
            self.telemetry, self.agreement, {name: engine.served_name for engine in engines for name in engine.names}
        )
        self.reroute(splits, mirrors)  # a split advertises what its engines do, as the gateway narrows it
        self.mirroring = Mirroring(self.background, self.agreement)
        instance_id = options.instance_id or (
            next(iter(engines)).facts.instance_id if len(engines) == 1 else uuid.uuid4().hex
        )
        self.generation = GenerationService(
            engines,
            self.registry,
            self.state,
            loras,
            self.background,
            limits=limits,
            bounds=bounds,
            telemetry=self.telemetry,
            mirroring=self.mirroring,
            unread=UnreadLedger(options.max_unread_per_stream, options.max_unread_per_caller),
        )
        self.tasks = TaskService(
            engines,
            self.registry,
            self.state,
            loras,
            self.background,
            limits=limits,
            bounds=bounds,
            telemetry=self.telemetry,
        )
        self.lifecycle: LifecycleService
        self.discovery: DiscoveryService
        self.lora: LoraService
        probe_timeout, host = options.probe_timeout_s, options.advertise_host
        if siblings is None:
            self.lifecycle = LifecycleService(
                engines,
                self.registry,
                self.state,
                probe_timeout=probe_timeout,
                probes_per_s=options.max_probes_per_s,
                bounds=bounds,
            )
            self.discovery = DiscoveryService(engines, instance_id=instance_id, advertise_host=host)
            self.lora = LoraService(engines, loras, bounds=bounds)
        else:
            self.lifecycle = PeeredLifecycle(
                siblings,
                engines,
                self.registry,
                self.state,
                probe_timeout=probe_timeout,
                probes_per_s=options.max_probes_per_s,
                bounds=bounds,
            )
            self.discovery = PeeredDiscovery(siblings, engines, instance_id=instance_id, advertise_host=host)
            self.lora = PeeredLora(siblings, engines, loras, bounds=bounds)
        self.events = EventService(
            engines,
            self.background,
            kv_replay_batches=options.kv_replay_batches,
            subscriber_queue=options.subscriber_queue,
            max_subscriptions=options.max_subscriptions,
            memory=self.registry.memory,
        )
        self.monitor = EngineMonitor(engines, self.registry, self.state, interval_s=options.health_poll_s)
        self._monitor_task: asyncio.Task[None] | None = None
        self._canary_task: asyncio.Task[None] | None = None

    @property
    def routes(self) -> RouteTable:
        """The served names, splits and mirrors now in effect."""
        return self.engines.routes

    def reroute(self, splits: Sequence[SplitSection], mirrors: Sequence[MirrorSection]) -> RouteTable:
        """Serve these splits and mirrors from now on; validated first (a ``ConfigurationError`` names the
        bad entry and changes nothing). Requests already running keep their engines and copies. A split's
        canary keeps running while its analysis stays the same, and sets its two engines' weights."""
        if self.siblings is not None and any(split.analysis for split in splits):
            raise ConfigurationError(
                "a split's analysis (a canary) needs one gateway process: each of --frontends would judge and "
                "step its own share of the traffic; serve it with --frontends 1"
            )
        canaries, weighted = self.canaries.plan(splits)
        table = self.engines.reroute(weighted, mirrors)
        self.canaries.commit(canaries, weighted)
        return table

    def control_canary(self, split: str, action: str) -> RouteTable:
        """An operator's ``action`` (``canary.ACTIONS``) on ``split``'s canary, by the current caller."""
        if self.canaries.control(split, action, current_caller()):
            self._apply_canaries()
        return self.routes

    def _apply_canaries(self) -> None:
        routes = self.engines.routes
        self.engines.reroute(self.canaries.weighted(routes.splits), routes.mirrors)

    async def _drive_canaries(self) -> None:
        """Judge every canary now and then; swap the routes when one moved its candidate."""
        while True:
            await asyncio.sleep(self.canaries.interval_s())
            try:
                if self.canaries.tick():
                    self._apply_canaries()
            except Exception:  # broad on purpose: a canary's failure must not stop the others, nor serving
                log.exception("canary analysis failed")

    @property
    def serving(self) -> bool:
        """Started, not draining, and every engine READY or DEGRADED: what grpc.health.v1 reports."""
        return (
            self.state.started
            and not self.state.draining
            and self.monitor.overall in (pb.HEALTH_STATE_READY, pb.HEALTH_STATE_DEGRADED)
        )

    def start(self) -> None:
        """Begin serving: start event pumps and the engine monitor, and admit requests."""
        self.events.start()
        self._monitor_task = asyncio.create_task(self.monitor.run(), name="engine monitor")
        self._canary_task = asyncio.create_task(self._drive_canaries(), name="canaries")
        self.state.started = True

    async def settle(self, drain_timeout_s: float) -> None:
        """Stop admitting; let in-flight requests finish for up to ``drain_timeout_s``; abort the
        rest (their streams end with the contract's terminal events); end subscriptions."""
        self.state.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout_s
        while len(self.registry) and loop.time() < deadline:
            await self.registry.wait_changed(deadline - loop.time())
        for active in self.registry.in_flight():
            active.abort("the gateway is shutting down")
        self.mirroring.close()
        self.events.close("the gateway is shutting down")
        self.lifecycle.close("the gateway is shutting down")

    async def stop(self, *, drain_timeout_s: float = 0.0) -> None:
        """``settle``, then finish background work and stop every engine."""
        await self.settle(drain_timeout_s)
        for task in (self._monitor_task, self._canary_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.background.wait(5.0)
        self.background.cancel_all()
        for engine in self.engines:
            try:
                await engine.backend.stop()
            except Exception:  # broad on purpose: one engine failing to stop must not strand the rest
                log.exception("stopping %s failed", engine.served_name)


__all__ = ["Gateway", "GatewayOptions"]
