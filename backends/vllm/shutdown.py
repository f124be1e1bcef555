"""Stopping vLLM's engine-core processes in order, a Ctrl-C to the whole process group included.

A Ctrl-C in a terminal signals every process of the foreground group, vLLM's own among them. The
EngineCore process leaves its busy loop on that SIGINT and, before shutting its executor down (which
reaps its workers and unlinks their message queues' shared memory), puts SIGTERM and SIGINT back to
their default actions (``run_engine_core`` in vllm/v1/engine/core.py). ``AsyncLLM.shutdown`` then sends
it SIGTERM (``shutdown`` in vllm/v1/utils.py), which kills it mid-cleanup: its worker is left defunct
and the resource tracker reports leaked shared memory. So the driver first waits, for a bounded
time, for an engine core that is already on its way out, and only then runs vLLM's shutdown.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

SELF_EXIT_GRACE_S = 10.0
"""How long an engine core already exiting on its own gets before vLLM's SIGTERM (its cleanup
takes well under a second on the tiny model)."""


def shut_down(engine: Any) -> None:
    """Shut an ``AsyncLLM`` down once its exiting engine cores are gone; blocking (run it in a thread)."""
    manager = getattr(engine.engine_core.resources, "engine_manager", None)
    await_exits_under_way(getattr(manager, "processes", ()))
    engine.shutdown()


def await_exits_under_way(processes: Iterable[BaseProcess], grace_s: float = SELF_EXIT_GRACE_S) -> None:
    """Join, within ``grace_s`` in all, each process that no longer handles SIGTERM: one exiting on its own."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        if process.pid is not None and process.is_alive() and not handles(process.pid, signal.SIGTERM):
            process.join(max(0.0, deadline - time.monotonic()))


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux's ``/proc``); True where that cannot be told."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return True


__all__ = ["SELF_EXIT_GRACE_S", "await_exits_under_way", "handles", "shut_down"]
