"""The KV sessions a prefill engine holds: SGLang prefills still waiting for their decode engine.

SGLang runs the prefill and the decode of one request concurrently; they meet through the
prefill's bootstrap server, and the prefill finishes only once the decode side took the KV. The
OpenEngine prefill stream ends at admission (``PrefillReady``), so the driver, not the stream,
owns the SGLang prefill from then on: it ends on its own (KV sent, SGLang's bootstrap timeout),
or by ``abort_kv_session`` and a drain past its deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from openengine_gateway.spi import BackgroundTasks, HeldKvSessions


class PrefillSessions:
    """Held prefills by session id; ``abort_rid`` is SGLang's abort of one request id."""

    def __init__(self, abort_rid: Callable[[str], None]) -> None:
        self._abort_rid = abort_rid
        self._held: HeldKvSessions[tuple[str, asyncio.Task[None]]] = HeldKvSessions()
        self._prefills = BackgroundTasks()  # a failure is logged: the client is gone, the decode side sees it

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, session_id: str, rid: str, prefill: Callable[[], Awaitable[None]]) -> None:
        """Run ``prefill()`` (SGLang request ``rid``) until it ends or the session is released."""
        task = self._prefills.spawn(self._run(session_id, prefill), f"the prefill of KV session {session_id}")
        self._held.hold(session_id, (rid, task), self._abort)

    async def _run(self, session_id: str, prefill: Callable[[], Awaitable[None]]) -> None:
        try:
            await prefill()
        finally:
            self._held.discard(session_id)

    def _abort(self, held: tuple[str, asyncio.Task[None]], reason: str) -> None:
        rid, task = held
        self._abort_rid(rid)
        task.cancel()  # closing SGLang's generator aborts a request that was not dispatched yet

    def release(self, session_id: str) -> bool:
        """Abort the prefill of ``session_id``; False when none is held."""
        return self._held.release(session_id)

    def release_all(self) -> int:
        """Abort every held prefill; how many there were."""
        return self._held.release_all()


__all__ = ["PrefillSessions"]
