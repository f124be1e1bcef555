"""A one-line progress bar on stderr, redrawn at most ten times a second (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .records import RequestRecord

BAR_WIDTH = 30


class Progress:
    """A bar of one target's run, with requests done, failures and elapsed time.

    The bar fills with whichever bound ends the run first: requests done of ``total``, or
    elapsed seconds of ``duration_s``; with neither known it is left out.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        duration_s: float | None = None,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.duration_s = duration_s
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

    @property
    def fraction(self) -> float | None:
        """How much of the run is done, 0 to 1; None when nothing bounds it."""
        fractions = []
        if self.total is not None:
            fractions.append(self.done / self.total)
        if self.duration_s is not None:
            fractions.append(self._elapsed / self.duration_s)
        return min(1.0, max(fractions)) if fractions else None

    def _draw(self) -> None:
        if not self.enabled:
            return
        fraction = self.fraction
        bar = ""
        if fraction is not None:
            filled = int(fraction * BAR_WIDTH)
            bar = f" |{'#' * filled}{'.' * (BAR_WIDTH - filled)}| {fraction:4.0%}"
        done = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        failed = f", {self.failed} failed" if self.failed else ""
        limit = f"/{self.duration_s:g}s" if self.duration_s is not None else "s"
        self.stream.write(f"\r{self.label}:{bar} {done} requests{failed} [{self._elapsed:.1f}{limit}]")
        self.stream.flush()


__all__ = ["Progress"]
