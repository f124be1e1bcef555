"""One vLLM engine core behind several gateway frontend processes, with vLLM's own machinery.

This is what ``vllm serve --api-server-count N`` does (``run_multi_api_server``): the supervisor
binds one input and one output ZeroMQ listener per frontend (``bind_engine_zmq_listeners``),
launches the engine core (``launch_core_engines``), and frontend ``i`` builds its ``AsyncLLM`` from
the same engine arguments with those listeners as its ``client_addresses`` (``client_count`` N,
``client_index`` i), as vLLM's ``APIServerProcessManager`` hands them to its API servers. The
engine core then routes each request's outputs to the frontend that sent it.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_gateway.spi import SharedEngine

from . import startup
from .settings import VllmSettings
from .shutdown import await_exits_under_way

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmAttachment:
    """What frontend ``client_index`` needs to join the engine core: vLLM's ``client_config``
    (its listening sockets travel to the frontend process as file descriptors)."""

    client_config: dict[str, Any]

    @property
    def client_count(self) -> int:
        return int(self.client_config["client_count"])

    @property
    def client_index(self) -> int:
        return int(self.client_config["client_index"])


def as_api_process(args: Any, *, frontends: int, rank: int) -> Any:
    """vLLM's ``AsyncEngineArgs`` marked as API server ``rank`` of ``frontends`` (-1: the supervisor, which
    starts the core), as ``run_multi_api_server`` marks them."""
    args._api_process_count = frontends
    args._api_process_rank = rank
    return args


def attached_engine(args: Any, attachment: VllmAttachment, stat_logger: Any) -> Any:
    """Frontend ``attachment.client_index``'s ``AsyncLLM`` on the supervisor's engine core, from the
    settings' engine ``args``, as vLLM's API server builds it (``build_async_engine_client``); blocking
    until the core says it is ready."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = as_api_process(args, frontends=attachment.client_count, rank=attachment.client_index)
    config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    addresses = {k: v for k, v in attachment.client_config.items() if k not in ("client_count", "client_index")}
    return AsyncLLM.from_vllm_config(
        vllm_config=config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        stat_loggers=[stat_logger],
        enable_log_requests=args.enable_log_requests,
        disable_log_stats=args.disable_log_stats,
        client_addresses=addresses,
        client_count=attachment.client_count,
        client_index=attachment.client_index,
    )


def stamp_stats(engine: Any, stamps: dict[int, float]) -> None:
    """Keep, per engine core, when it made the last outputs that carried scheduler stats.

    With several frontends vLLM sends each step's stats to one of them, so the stats made last are
    the engine's, wherever they went. ``EngineCoreOutputs.timestamp`` is the core's ``time.monotonic``,
    one clock for every process of the host; the time a frontend got them is not (a busy frontend can
    take older stats after its sibling took newer ones). Costs one call per engine step, none per token.
    """
    core = engine.engine_core
    receive = core.get_output_async

    async def get_output_async() -> Any:
        outputs = await receive()
        if outputs.scheduler_stats is not None:
            stamps[outputs.engine_index] = outputs.timestamp
        return outputs

    core.get_output_async = get_output_async  # AsyncLLM's output loop looks it up for every batch


def unix_nanos(monotonic_s: float) -> int:
    """A ``time.monotonic`` reading of this host as ``time.time_ns``."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class VllmSharedEngine(SharedEngine):
    """vLLM's engine core (and DP coordinator, if any) started for ``frontends`` API processes."""

    def __init__(self, settings: VllmSettings, frontends: int) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
        from vllm.v1.executor import Executor

        args = as_api_process(startup.engine_args(settings), frontends=frontends, rank=-1)
        config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        self._sockets: tempfile.TemporaryDirectory[str] | None = startup.socket_directory()
        self._manager: Any = None
        self._coordinator: Any = None
        self._listeners: Any = None
        """vLLM's ``EngineZmqListeners``: the frontends' sockets, bound here."""
        base = startup.rpc_base_path(self._sockets.name) if self._sockets is not None else contextlib.nullcontext()
        with base:  # vLLM's processes inherit the socket directory
            listeners = self._listeners = bind_engine_zmq_listeners(config, frontends)
            try:
                with launch_core_engines(
                    config, Executor.get_class(config), not args.disable_log_stats, listeners.addresses
                ) as launch:
                    self._manager, self._coordinator = launch.engine_manager, launch.coordinator
            except BaseException:
                self.stop()
                raise
        stats = self._coordinator.get_stats_publish_address() if self._coordinator is not None else None
        self._attachments = [
            VllmAttachment(
                {
                    "input_address": inputs.address,
                    "output_address": outputs.address,
                    "input_listener": inputs.socket,
                    "output_listener": outputs.socket,
                    "client_count": frontends,
                    "client_index": index,
                    **({"stats_update_address": stats} if stats is not None else {}),
                }
            )
            for index, (inputs, outputs) in enumerate(zip(listeners.inputs, listeners.outputs, strict=True))
        ]
        log.info("vLLM engine core started for %d frontend processes", frontends)

    @property
    def attachments(self) -> Sequence[VllmAttachment]:
        return self._attachments

    def frontends_started(self) -> None:
        """The frontends adopted the listening sockets: close the supervisor's copies."""
        for listener in (*self._listeners.inputs, *self._listeners.outputs):
            listener.close()

    def stop(self) -> None:
        """Stop the engine core and coordinator; remove the listeners' and sockets' files."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            await_exits_under_way(getattr(manager, "processes", ()))  # a Ctrl-C reached them too
            manager.shutdown()
        if self._coordinator is not None:
            coordinator, self._coordinator = self._coordinator, None
            coordinator.shutdown()
        if self._listeners is not None:
            listeners, self._listeners = self._listeners, None
            listeners.cleanup()
        if self._sockets is not None:
            self._sockets.cleanup()
            self._sockets = None


__all__ = ["VllmAttachment", "VllmSharedEngine", "as_api_process", "attached_engine", "stamp_stats", "unix_nanos"]
