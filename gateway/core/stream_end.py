"""How one Generate stream ended, recorded as it goes, so its cleanup reads one object.

``GenerationService.generate`` notes the last message it yielded (``final``), that the client
read every message (``read_all``), or that the driver refused the request before its first
message (``rejected``). ``ending`` then names the way it ended, and every cleanup decision
(free the id now or after the driver's abort, keep or release a prefill's KV session, the
outcome counted) follows from that one value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .. import pb
from .telemetry import outcome


class Ending(enum.Enum):
    """The ways a Generate stream ends; the values of the four accepted ones are ``telemetry.OUTCOMES``,
    in the order of ``telemetry.outcome``, the one rule a task's outcome follows too."""

    FINISHED = "finished"
    """Every output finished (or the prefill handed off) and the client read it all: nothing runs in the driver."""
    FAILED = "failed"
    """Its last message is a terminal ``EngineError`` (the driver's, or a broken stream contract)."""
    ABORTED = "aborted"
    """``Abort``, a drain or its KV session's abort stopped it."""
    CANCELLED = "cancelled"
    """Its client left (cancelled, or its deadline passed) before it ended."""
    REJECTED = "rejected"
    """The driver refused it before its first message: never accepted, so never finished."""


@dataclass(slots=True)
class StreamEnd:
    """What one stream has done so far; ``ending`` reads how it ended once it is over."""

    final: pb.GenerateResponse | None = None
    """The last message yielded to the client."""
    written: bool = False
    """The client read past the last message (grpc asks for the next one once it is written)."""
    complete: bool = False
    """The last message was the stream's final one (the encoder was done)."""
    rejected: bool = False
    """The driver raised a ``RequestError`` before the first message."""

    def read_all(self, *, complete: bool) -> None:
        """The client read every message; ``complete``: the last one was the final one."""
        self.written = True
        self.complete = complete

    def ending(self, *, aborted: bool) -> Ending:
        """How the stream ended, given whether its request was aborted.

        Only a complete stream that failed nothing and was not aborted leaves nothing running:
        after an error (the driver's, or a contract violation while the driver still runs) the
        driver is told to abort too.
        """
        if self.rejected:
            return Ending.REJECTED
        failed = self.final is not None and self.final.HasField("error")
        finished = self.written and self.complete and not aborted and not failed
        return Ending(outcome(finished=finished, failed=failed, aborted=aborted))


__all__ = ["Ending", "StreamEnd"]
