"""A one-line progress display on stderr, redrawn at most ten times a second (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .records import RequestRecord


class Progress:
    """Requests done (of the total when known), failures and elapsed time of one target's run."""

    def __init__(self, label: str, total: int | None, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = 0
        self.failed = 0
        self._elapsed = 0.0
        """Seconds into the measured phase (the records' clock: warm-up is not counted)."""
        self._drawn = 0.0

    def update(self, record: RequestRecord) -> None:
        """Count a finished request (a callback of the runner)."""
        self.done += 1
        self.failed += not record.ok
        self._elapsed = max(self._elapsed, record.ended)
        now = time.monotonic()
        if now - self._drawn >= 0.1 or self.done == self.total:
            self._drawn = now
            self._draw()

    def close(self) -> None:
        """Draw the final state and end the line."""
        self._draw()
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        done = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        failed = f", {self.failed} failed" if self.failed else ""
        self.stream.write(f"\r{self.label}: {done} requests{failed} [{self._elapsed:.1f}s]")
        self.stream.flush()


__all__ = ["Progress"]
