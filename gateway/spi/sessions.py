"""KV sessions an engine holds: a prefill's KV kept for the decode engine that will take it.

A prefill stream ends at ``PrefillDone``; from then on the driver, not the stream, owns the
session's resources until the decode side takes them, the client aborts the session
(``Backend.abort_kv_session``), a drain past its deadline releases them all
(``Backend.abort_all_kv_sessions``), or they expire. ``HeldKvSessions`` is that bookkeeping,
so that each session is released exactly once, however many of those race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Held(Generic[T]):
    resources: T
    release: Callable[[T, str], None]
    expiry: asyncio.TimerHandle | None


class HeldKvSessions(Generic[T]):
    """Held sessions by id, each with the engine's own record of what it holds (``resources``)
    and the way to free that: ``release(resources, reason)``, called once per session.

    With ``expire_after_s`` a session still held that long after ``hold`` is released with
    reason ``"timeout"``.
    """

    def __init__(self, expire_after_s: float | None = None) -> None:
        self._expire_after_s = expire_after_s
        self._held: dict[str, _Held[T]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def get(self, session_id: str) -> T | None:
        """The resources of a held session; None when it is not held."""
        held = self._held.get(session_id)
        return held.resources if held is not None else None

    def hold(self, session_id: str, resources: T, release: Callable[[T, str], None]) -> None:
        """Hold ``resources`` for ``session_id`` until it is released, discarded or expires."""
        expiry = None
        if self._expire_after_s is not None:
            expiry = asyncio.get_running_loop().call_later(self._expire_after_s, self.release, session_id, "timeout")
        self._held[session_id] = _Held(resources, release, expiry)

    def release(self, session_id: str, reason: str = "aborted") -> bool:
        """Free the session's resources; False when it is not held."""
        held = self._pop(session_id)
        if held is None:
            return False
        held.release(held.resources, reason)
        return True

    def release_all(self, reason: str = "aborted") -> int:
        """Release every held session; how many there were."""
        return sum(self.release(session_id, reason) for session_id in list(self._held))

    def discard(self, session_id: str) -> bool:
        """Stop holding a session that ended on its own, without releasing it; False when not held."""
        return self._pop(session_id) is not None

    def _pop(self, session_id: str) -> _Held[T] | None:
        held = self._held.pop(session_id, None)
        if held is not None and held.expiry is not None:
            held.expiry.cancel()
        return held


__all__ = ["HeldKvSessions"]
