"""The KV sessions a prefill engine holds: SGLang prefills still waiting for their decode engine.

SGLang runs the prefill and the decode of one request concurrently; they meet through the
prefill's bootstrap server, and the prefill finishes only once the decode side took the KV. The
OpenEngine prefill stream ends at admission (``PrefillReady``), so the driver, not the stream,
owns the SGLang prefill from then on: it ends on its own (KV sent, SGLang's bootstrap timeout),
or by ``abort_kv_session`` and a drain past its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class PrefillSessions:
    """Held prefills by session id; ``abort_rid`` is SGLang's abort of one request id."""

    def __init__(self, abort_rid: Callable[[str], None]) -> None:
        self._abort_rid = abort_rid
        self._held: dict[str, tuple[str, asyncio.Task[None]]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, session_id: str, rid: str, prefill: Callable[[], Awaitable[None]]) -> None:
        """Run ``prefill()`` (SGLang request ``rid``) until it ends or the session is released."""
        self._held[session_id] = (rid, asyncio.create_task(self._run(session_id, prefill)))

    async def _run(self, session_id: str, prefill: Callable[[], Awaitable[None]]) -> None:
        try:
            await prefill()
        except Exception:  # broad on purpose: the client is gone; the decode side sees the failure
            log.exception("the prefill of KV session %s failed", session_id)
        finally:
            self._held.pop(session_id, None)

    def release(self, session_id: str) -> bool:
        """Abort the prefill of ``session_id``; False when none is held."""
        held = self._held.pop(session_id, None)
        if held is None:
            return False
        rid, task = held
        self._abort_rid(rid)
        task.cancel()  # closing SGLang's generator aborts a request that was not dispatched yet
        return True

    def release_all(self) -> int:
        """Abort every held prefill; how many there were."""
        sessions = list(self._held)
        for session_id in sessions:
            self.release(session_id)
        return len(sessions)


__all__ = ["PrefillSessions"]
