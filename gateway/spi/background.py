"""Background work a driver starts and owns: tasks that are neither lost nor left running.

``asyncio`` keeps only a weak reference to a task, so a fire-and-forget ``create_task`` can be
garbage-collected mid-flight, and its exception is reported (if ever) only when it is. A driver
spawns such work through one ``BackgroundTasks`` instead: it holds every task until it ends,
logs a failure with what the task was for (then tells the driver, which may mark itself
NOT_READY), and cancels and awaits whatever still runs when the driver stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

CANCEL_AGAIN_S = 0.1
"""How long ``stop`` waits for cancelled tasks before it cancels those still running again."""


class BackgroundTasks:
    """The tasks a driver runs beside its requests; ``stop`` cancels and awaits them.

    ``on_failure(what, exc)`` is called, after the failure is logged, for a task that raised
    (cancellation is not a failure).
    """

    def __init__(self, on_failure: Callable[[str, Exception], None] | None = None) -> None:
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Run ``work`` (described by ``what``, for the log) until it ends or ``stop``."""
        task = asyncio.create_task(self._run(work, what), name=what)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._ended(done, work))
        return task

    def _ended(self, task: asyncio.Task[None], work: Coroutine[Any, Any, None]) -> None:
        self._tasks.discard(task)
        work.close()  # a task cancelled before it ran never started ``work``: close it, unawaited, silently

    async def _run(self, work: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broad on purpose: nobody awaits this task, so its failure is reported here
            log.exception("%s failed", what)
            if self._on_failure is not None:
                self._on_failure(what, exc)

    async def stop(self) -> None:
        """Cancel every task still running and wait until each has ended.

        A task is cancelled again while it runs on: on Python 3.11 ``asyncio.wait_for`` returns the
        result, swallowing the cancellation, when what it waits for completes at the same moment
        (fixed in 3.12), and engines' own readers wait that way (TensorRT-LLM's ``IterationResult``,
        a statistics queue read with a timeout). Seen on a loaded CI machine: a stop waited forever.
        """
        while running := [task for task in self._tasks if not task.done()]:
            for task in running:
                task.cancel()
            await asyncio.wait(running, timeout=CANCEL_AGAIN_S)


__all__ = ["BackgroundTasks"]
