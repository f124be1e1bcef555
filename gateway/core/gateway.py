"""The gateway core: the contract applied to a set of started engines.

``Gateway`` composes one service per concern. The transport calls these services and never
reaches a driver directly; the services are the only callers of the backend SPI.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from ..contract.lora import LoraRegistry
from ..contract.registry import RequestRegistry
from ..engines import EngineSet
from .background import BackgroundTasks
from .discovery import DiscoveryService
from .events import EventService
from .generation import GenerationService
from .lifecycle import LifecycleService
from .lora import LoraService
from .state import GatewayState
from .tasks import TaskService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayOptions:
    """Engine-neutral limits and behaviour, from the command line or ``plugins.toml``."""

    max_in_flight: int | None = None
    """Concurrent requests (all kinds) before RESOURCE_EXHAUSTED; None = unlimited."""
    finished_window: int = 65536
    """How many finished request ids ``Abort`` remembers (ALREADY_FINISHED)."""
    kv_replay_batches: int = 4096
    """KV event batches retained per rank for replay."""
    subscriber_queue: int = 1024
    """Events a subscriber may fall behind by before it is ended with a retryable error."""
    probe_timeout_s: float = 30.0
    """How long a Health inference probe may take."""
    lora_roots: tuple[str, ...] = ()
    """Directories LoRA adapters must resolve into; empty = any directory."""
    advertise_host: str = "127.0.0.1"
    """The routable host advertised in place of a wildcard bind address."""
    instance_id: str = ""
    """EngineInfo/LoadInfo instance id; empty = the engine's own (one engine) or a new uuid."""


class Gateway:
    """Every OpenEngine RPC, engine-neutral, over ``engines``."""

    def __init__(self, engines: EngineSet, options: GatewayOptions = GatewayOptions()) -> None:
        self.engines = engines
        self.options = options
        self.state = GatewayState()
        self.registry = RequestRegistry(finished_window=options.finished_window, max_in_flight=options.max_in_flight)
        self.background = BackgroundTasks()
        loras = LoraRegistry(options.lora_roots)
        instance_id = options.instance_id or (
            next(iter(engines)).facts.instance_id if len(engines) == 1 else uuid.uuid4().hex
        )
        self.generation = GenerationService(engines, self.registry, self.state, loras, self.background)
        self.tasks = TaskService(engines, self.registry, self.state, loras, self.background)
        self.lifecycle = LifecycleService(engines, self.registry, self.state, probe_timeout=options.probe_timeout_s)
        self.discovery = DiscoveryService(engines, instance_id=instance_id, advertise_host=options.advertise_host)
        self.lora = LoraService(engines, loras)
        self.events = EventService(
            engines,
            self.background,
            kv_replay_batches=options.kv_replay_batches,
            subscriber_queue=options.subscriber_queue,
        )

    def start(self) -> None:
        """Begin serving: start event pumps and admit requests."""
        self.events.start()
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
        self.events.close("the gateway is shutting down")

    async def stop(self, *, drain_timeout_s: float = 0.0) -> None:
        """``settle``, then finish background work and stop every engine."""
        await self.settle(drain_timeout_s)
        await self.background.wait(5.0)
        self.background.cancel_all()
        for engine in self.engines:
            try:
                await engine.backend.stop()
            except Exception:  # broad on purpose: one engine failing to stop must not strand the rest
                log.exception("stopping %s failed", engine.served_name)


__all__ = ["Gateway", "GatewayOptions"]
