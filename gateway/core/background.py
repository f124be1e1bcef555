"""Fire-and-forget work (driver aborts, event pumps) that must not be garbage-collected or lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    """Holds references to background tasks and logs their failures."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        """Run ``coroutine`` in the background; ``what`` names it in logs."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def _done(self, task: asyncio.Task[Any], what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %r failed", what, exc_info=task.exception())

    async def wait(self, within_s: float) -> None:
        """Wait up to ``within_s`` seconds for the tasks running now (shutdown)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=within_s)

    def cancel_all(self) -> None:
        """Cancel every task still running."""
        for task in list(self._tasks):
            task.cancel()

    def __len__(self) -> int:
        return len(self._tasks)


__all__ = ["BackgroundTasks"]
