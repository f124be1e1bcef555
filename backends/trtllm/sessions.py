"""Prefill requests held by KV session id, and quiet aborts of TensorRT-LLM request handles.

A context-only request reports its handoff before it is final: TensorRT-LLM keeps its KV cache
until a generation-only request pulls it. The handle is held (and read to its end, so it
finishes) under the session id the decode side receives, so ``Abort(kv_session)`` and a drain
past its deadline can release the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


def abort_handle(handle: Any) -> None:
    """``RequestOutput.abort``, which may fail harmlessly for a request that just finished."""
    try:
        handle.abort()
    except Exception:  # broad on purpose: aborting a request that just finished is harmless
        log.debug("TensorRT-LLM abort of request %s failed", getattr(handle, "request_id", "?"), exc_info=True)


class HeldSessions:
    """Context-only requests waiting for their decode side, by session id."""

    def __init__(self, spawn: Spawn) -> None:
        self._spawn = spawn
        self._handles: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def hold(self, session_id: str, handle: Any) -> None:
        """Keep ``handle`` until TensorRT-LLM reports it final (the KV cache was pulled)."""
        self._handles[session_id] = handle

        async def drain() -> None:
            try:
                async for _ in handle:
                    pass
            except Exception:  # broad on purpose: a failed transfer ends this session, not the engine
                log.warning("TensorRT-LLM KV session %s ended with an error", session_id, exc_info=True)
            finally:
                if self._handles.get(session_id) is handle:
                    del self._handles[session_id]

        self._spawn(drain(), f"KV session {session_id}")

    def release(self, session_id: str) -> bool:
        """Abort the context request holding the session's KV cache; False when none does."""
        handle = self._handles.pop(session_id, None)
        if handle is None:
            return False
        abort_handle(handle)
        return True

    def release_all(self) -> int:
        """Release every held session; how many there were."""
        sessions = list(self._handles)
        for session_id in sessions:
            self.release(session_id)
        return len(sessions)


__all__ = ["HeldSessions", "Spawn", "abort_handle"]
