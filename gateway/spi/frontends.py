"""One engine behind several gateway frontend processes (``--frontends N``).

A Python frontend spends tens of microseconds of CPU per streamed token, so one process caps what
a fast engine can deliver. With ``--frontends N`` the command becomes a supervisor: it starts each
engine once, through ``Backend.share``, and spawns N frontend processes that each serve the whole
gateway on the same address (``SO_REUSEPORT``), each attached to that engine through
``Backend.attach`` before its ``start``. The gateway keeps Abort, Drain, LoRA, GetLoad and the
metrics correct across the processes itself; a driver only starts and attaches.

A driver that can do this overrides both hooks (the vLLM driver runs vLLM's own multi-API-server
machinery); one that does not is refused before anything starts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class SharedEngine(ABC):
    """An engine the supervisor started once for several frontend processes (``Backend.share``).

    The supervisor spawns the frontends with ``multiprocessing``'s spawn method and hands frontend
    ``i`` ``attachments[i]``: so an attachment may hold what that method can pass (open sockets,
    pipes) besides plain picklable values. Its methods block; the supervisor calls them from a
    thread.
    """

    @property
    @abstractmethod
    def attachments(self) -> Sequence[object]:
        """One value per frontend process, in frontend order, for its ``Backend.attach``."""

    def frontends_started(self) -> None:
        """The frontend processes have their attachments: release the supervisor's copies of what
        they now own (listening sockets). The default holds nothing."""
        return None

    @abstractmethod
    def stop(self) -> None:
        """Stop the engine, once every frontend process has exited (or failed to start)."""


__all__ = ["SharedEngine"]
