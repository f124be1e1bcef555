"""The request-id namespace shared by Generate, Embed, Classify and Score.

One registry per gateway. An accepted request is in flight until it ends; its id then moves
to a bounded window of finished ids, so ``Abort`` can answer ALREADY_FINISHED for recent
requests and NOT_FOUND for ids it never saw (or forgot). An in-flight duplicate is rejected
before acceptance with ALREADY_EXISTS. The in-flight count is also the admission limit and
what ``Drain`` waits on. KV sessions get the same memory: the ids this gateway handed out in
a ``PrefillReady`` or released by ``Abort``, so aborting one again is ALREADY_FINISHED.

Each request and remembered session keeps its owner (a token's name, or None), so that a
lookup can be limited to what one caller reaches (``reaches``), and the in-flight count per
owner is the per-token fairness limit. A token's request ids are its own namespace: the registry
(and the engine) know a request by ``callers.scoped_id`` (``alice/r1``), so Bob's ``r1`` is
another request than Alice's; ``find`` and ``finished`` look an id up as a caller sees it, a caller
that sees all in every owner's namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import AlreadyExists, EngineFailure, ResourceExhausted, clip
from .callers import Caller, scoped_id
from .memory import MemoryBudget


@dataclass(slots=True, eq=False)
class ActiveRequest:
    """An accepted request. ``stop`` makes it end promptly and ``on_failure`` ends it with an
    engine failure (the core sets both at admission)."""

    request_id: str
    """The id in the registry and the engine (``callers.scoped_id``)."""
    kind: str
    model: str
    client_id: str = ""
    """The id as its client sent it (``request_id`` when empty)."""
    kv_session_id: str | None = None
    owner: str | None = None
    """The name of the token that started it; None when it was started without one."""
    stop: Callable[[str], object] = field(default=lambda _reason: None)
    on_failure: Callable[[EngineFailure], object] = field(default=lambda _failure: None)
    aborted: bool = False
    abort_reason: str = ""
    failure: EngineFailure | None = None
    ended: bool = False
    """Its final response exists, or its stream is over: nothing is left to abort or fail, though
    the id stays in flight until the driver has let go of it."""
    engine_abort: asyncio.Task[None] | None = None
    """The driver's abort of it, once started (``core.aborts``)."""

    def abort(self, reason: str) -> None:
        """Mark aborted and stop it; idempotent, and moot once ended."""
        if not self.aborted and not self.ended:
            self.aborted = True
            self.abort_reason = reason
            self.stop(reason)

    def fail(self, failure: EngineFailure) -> None:
        """End it with ``failure`` (its engine went down); idempotent, and moot once aborted or ended."""
        if self.failure is None and not self.aborted and not self.ended:
            self.failure = failure
            self.on_failure(failure)


_KEPT_ID_CHARS = 128
"""A remembered id longer than this is kept as its digest: the window's memory is bounded by its
length, however long the ids clients send."""


def _kept(identifier: str) -> str | bytes:
    """How an id is remembered in the finished window."""
    if len(identifier) <= _KEPT_ID_CHARS:
        return identifier
    return hashlib.blake2b(identifier.encode("utf-8", "surrogatepass"), digest_size=32).digest()


Reaches = Callable[[str | None], bool]
"""Whether a caller reaches what an owner started (``core.callers.Caller.reaches``)."""


def _anyone(_owner: str | None) -> bool:
    return True


class RequestRegistry:
    """In-flight requests by id, recently finished ids, and change notification for drains."""

    def __init__(
        self,
        *,
        finished_window: int = 65536,
        max_in_flight: int | None = None,
        max_in_flight_per_owner: int | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.memory = memory or MemoryBudget(None)
        """The process's memory budget, checked at each admission."""
        self._active: dict[str, ActiveRequest] = {}
        self._finished: OrderedDict[str | bytes, str | None] = OrderedDict()
        """Finished ids (``_kept``) → their owner, most recent last."""
        self._finished_window = finished_window
        self._sessions: OrderedDict[str, str | None] = OrderedDict()
        """KV session ids handed out or released → their owner, most recent last, within the same window."""
        self._max_in_flight = max_in_flight
        self._max_per_owner = max_in_flight_per_owner
        self._owned: Counter[str] = Counter()
        """In-flight requests per owner."""
        self._owners: set[str] = set()
        """Every owner seen (token names: as many as the configured tokens), the namespaces ``find`` searches
        for a caller that sees all."""
        self._changed = asyncio.Event()
        self.version = 0
        """Counts admits and releases (``wait_changed(since=...)``)."""

    def admit(self, request: ActiveRequest) -> None:
        """Register an accepted request, or reject a duplicate id / a full gateway / one past the memory budget."""
        held = self._active.get(request.request_id)
        if held is not None:
            shown = clip(request.client_id or request.request_id)
            if held.ended:
                raise AlreadyExists(f"request {shown} ended, but its engine is still aborting it")
            raise AlreadyExists(f"request {shown} is already in flight")
        if self._max_in_flight is not None and len(self._active) >= self._max_in_flight:
            raise ResourceExhausted(
                f"the gateway is at its limit of {self._max_in_flight} concurrent requests", retry_after_ms=100
            )
        self.memory.check()
        owner = request.owner
        if owner is not None:
            self._owners.add(owner)
            if self._max_per_owner is not None and self._owned[owner] >= self._max_per_owner:
                raise ResourceExhausted(
                    f"this token is at its limit of {self._max_per_owner} concurrent requests", retry_after_ms=100
                )
            self._owned[owner] += 1
        self._active[request.request_id] = request
        self._notify()

    def release(self, request: ActiveRequest, *, finished: bool = True) -> None:
        """The request ended (any way); remember its id as finished.

        ``finished=False`` withdraws a request rejected before acceptance: it leaves no finish
        behind (``Abort`` answers NOT_FOUND, or ALREADY_FINISHED for an earlier request that used
        the id and finished).
        """
        if self._active.get(request.request_id) is not request:
            return
        del self._active[request.request_id]
        owner = request.owner
        if owner is not None:
            self._owned[owner] -= 1
            if not self._owned[owner]:
                del self._owned[owner]
        if finished:
            kept = _kept(request.request_id)
            self._finished[kept] = owner
            self._finished.move_to_end(kept)
            if len(self._finished) > self._finished_window:
                self._finished.popitem(last=False)
        self._notify()

    def get(self, request_id: str) -> ActiveRequest | None:
        """The in-flight request with this id, if any."""
        return self._active.get(request_id)

    def find(self, request_id: str, caller: Caller) -> ActiveRequest | None:
        """The in-flight request ``caller`` knows as ``request_id``: its own, or any owner's for a caller
        that sees all (another's is None: as an id nobody used)."""
        for key in self._keys(request_id, caller):
            active = self._active.get(key)
            if active is not None and caller.reaches(active.owner):
                return active
        return None

    def finished(self, request_id: str, caller: Caller) -> bool:
        """Whether a request ``caller`` reaches finished as ``request_id`` recently (``recently_finished``)."""
        return any(self.recently_finished(key, caller.reaches) for key in self._keys(request_id, caller))

    def _keys(self, request_id: str, caller: Caller) -> list[str]:
        own = scoped_id(caller.name, request_id)
        if not caller.sees_all:
            return [own]
        return list(dict.fromkeys([own, request_id, *(scoped_id(owner, request_id) for owner in sorted(self._owners))]))

    def recently_finished(self, request_id: str, reaches: Reaches = _anyone) -> bool:
        """True when the id finished (started by an owner ``reaches`` allows), is still inside the
        remembered window, and is not in flight again."""
        if request_id in self._active:
            return False
        kept = _kept(request_id)
        return kept in self._finished and reaches(self._finished[kept])

    def in_flight(self) -> list[ActiveRequest]:
        """A snapshot of every in-flight request."""
        return list(self._active.values())

    def remember_session(self, session_id: str, owner: str | None = None) -> None:
        """A KV session this gateway handed out (``PrefillReady``) or released (``Abort``); the
        owner it was first remembered with stays."""
        sessions = self._sessions
        sessions[session_id] = sessions.get(session_id, owner)
        sessions.move_to_end(session_id)
        if len(sessions) > self._finished_window:
            sessions.popitem(last=False)

    def knows_session(self, session_id: str, reaches: Reaches = _anyone) -> bool:
        """True when the session was handed out or released inside the remembered window, and
        ``reaches`` allows its owner."""
        return session_id in self._sessions and reaches(self._sessions[session_id])

    def with_kv_session(self, session_id: str) -> list[ActiveRequest]:
        """In-flight requests attached to the KV session ``session_id``."""
        return [r for r in self._active.values() if r.kv_session_id == session_id]

    def owner_counts(self) -> dict[str, int]:
        """In-flight requests per owner (owners with none are left out)."""
        return dict(self._owned)

    def __len__(self) -> int:
        return len(self._active)

    async def wait_changed(self, within_s: float | None, *, since: int | None = None) -> None:
        """Return after the next admit/release, or after ``within_s`` seconds; at once when one
        happened after ``version`` was ``since``."""
        if since is not None and since != self.version:
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):  # not wait_for: on 3.11 it can swallow a cancel
                await changed.wait()

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()


__all__ = ["ActiveRequest", "Reaches", "RequestRegistry"]
