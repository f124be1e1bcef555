"""The root logger's lines during a block, through a handler of the test's own (engines may replace handlers)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class LineHandler(logging.Handler):
    """Keeps every message it handles."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def root_lines(level: int = logging.INFO) -> Iterator[LineHandler]:
    """Route the root logger at ``level`` to a ``LineHandler`` as well; its handlers and level are put back."""
    root = logging.getLogger()
    handler, previous = LineHandler(), root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


__all__ = ["LineHandler", "root_lines"]
