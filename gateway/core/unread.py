"""What slow or absent readers may make the gateway hold: unread tokens, per stream and per caller.

A Generate stream whose client reads slower than the engine generates holds the tokens it has not
read (``spi.events.EventStream`` coalesces them into one pending message per output), each with its
candidates. A client that never reads would hold a whole request's worth: 8 sequences of 1,024
tokens with every candidate's logprob pinned about 270 MiB. As Envoy's per-stream buffer limit
does, a stream past its bound is ended: the stream's pending tokens are dropped, its client gets
an ``OVERLOADED`` error (if it ever reads), its engine aborts the request at once. The cost is
counted in entries, one per token and one per candidate, about 130 bytes each.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import pb
from ..errors import EngineFailure

PER_STREAM = 262_144
"""The default bound of one stream (``--max-unread-per-stream``): about 35 MiB; 8 sequences of 1,024 tokens
with 31 candidates each fit it."""
PER_CALLER = 1_048_576
"""The default bound of one caller's streams together (``--max-unread-per-caller``): about 135 MiB."""


class UnreadLedger:
    """Unread entries held per caller (a token's name, or else a connection: one host may serve many
    anonymous users), and the bounds: ``per_stream`` and ``per_caller`` (over all of a caller's streams)."""

    def __init__(self, per_stream: int = PER_STREAM, per_caller: int = PER_CALLER) -> None:
        self.per_stream = per_stream
        self.per_caller = per_caller
        self._callers: dict[str, list[int]] = {}
        """Caller -> [entries its streams hold, its open streams]: one cell its meters share."""

    @property
    def by_caller(self) -> dict[str, int]:
        """Entries held unread per caller with a stream open."""
        return {caller: cell[0] for caller, cell in self._callers.items()}

    def meter(self, caller: str, on_overflow: Callable[[], object]) -> UnreadMeter:
        """A meter for one stream of ``caller``; ``on_overflow`` runs when it passes a bound."""
        cell = self._callers.setdefault(caller, [0, 0])
        cell[1] += 1
        return UnreadMeter(self, caller, cell, on_overflow)

    def _closed(self, caller: str, cell: list[int], held: int) -> None:
        cell[0] -= held
        cell[1] -= 1
        if not cell[1]:
            del self._callers[caller]


class UnreadMeter:
    """One stream's unread entries (``EventStream.meter``): the stream calls it with each change."""

    __slots__ = ("_caller", "_cell", "_ledger", "_on_overflow", "_open", "held")

    def __init__(self, ledger: UnreadLedger, caller: str, cell: list[int], on_overflow: Callable[[], object]) -> None:
        self._ledger = ledger
        self._caller = caller
        self._cell = cell
        self._on_overflow = on_overflow
        self._open = True
        self.held = 0

    def __call__(self, delta: int) -> EngineFailure | None:
        """Count ``delta`` entries (negative once read); the failure that ends the stream past a bound."""
        self.held += delta
        cell = self._cell
        cell[0] += delta
        if delta <= 0:
            return None
        ledger = self._ledger
        if self.held > ledger.per_stream:
            where = f"this stream's bound of {ledger.per_stream} (--max-unread-per-stream)"
        elif cell[0] > ledger.per_caller:
            where = f"this caller's bound of {ledger.per_caller} over all its streams (--max-unread-per-caller)"
        else:
            return None
        self._on_overflow()
        return EngineFailure(
            pb.ERROR_CODE_OVERLOADED,
            f"the client read too slowly: its unread tokens and candidates passed {where}",
            retryable=True,
        )

    def close(self) -> None:
        """The stream ended: what it held is freed (once)."""
        if self._open:
            self._open = False
            self._ledger._closed(self._caller, self._cell, self.held)
            self.held = 0


__all__ = ["PER_CALLER", "PER_STREAM", "UnreadLedger", "UnreadMeter"]
