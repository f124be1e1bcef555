"""What a run measured: the target, and one record per request with the receive time of every message.

Times are seconds on one monotonic clock whose zero is the start of the target's measured phase,
so records of one target line up for throughput over time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Target:
    """An OpenEngine endpoint and the model to ask it for (empty: the server's only model)."""

    address: str
    model: str = ""
    name: str = ""
    """How reports name the target; empty: its address and model."""

    @classmethod
    def parse(cls, text: str) -> Target:
        """``host:port/model`` (the model may itself contain ``/``) or ``host:port``."""
        address, _, model = text.partition("/")
        host, colon, port = address.rpartition(":")
        if not host or not colon or not port.isdigit():
            raise ValueError(f"a target is HOST:PORT/MODEL, not {text!r}")
        return cls(address, model)

    @property
    def label(self) -> str:
        """How reports name the target."""
        if self.name:
            return self.name
        return f"{self.address}/{self.model}" if self.model else self.address


def distinct(targets: Sequence[Target]) -> list[Target]:
    """``targets`` with labels told apart: a target given again (an A/A run) is ``LABEL #2``..."""
    seen: Counter[str] = Counter()
    named = []
    for target in targets:
        seen[target.label] += 1
        repeat = seen[target.label]
        named.append(target if repeat == 1 else replace(target, name=f"{target.label} #{repeat}"))
    return named


@dataclass
class RequestRecord:
    """One request as the client saw it.

    ``message_times`` and ``message_tokens`` hold, for every ``TokenOutput`` that carried tokens,
    when it arrived and how many tokens it carried: coalesced tokens share one arrival.
    ``error`` names the gRPC status (``UNAVAILABLE``) or the ``EngineError`` code
    (``ERROR_CODE_OVERLOADED``) that ended the request; ``None`` when it finished. ``error_message``
    is what the server said with it.
    """

    index: int
    started: float
    ended: float = 0.0
    message_times: list[float] = field(default_factory=list)
    message_tokens: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int | None = None
    error: str | None = None
    error_message: str = ""
    scheduled: float | None = None
    """Its arrival time at a request rate (``started`` is later when a cap or a slow target held it)."""

    @property
    def ok(self) -> bool:
        """Whether the request finished without an error."""
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """Tokens streamed to the client."""
        return len(self.token_ids)


@dataclass
class TargetRun:
    """The measured phase against one target: who answered, how long it took, every request."""

    target: Target
    engine: str
    duration_s: float
    records: list[RequestRecord]
    interrupted: bool = False
    """Stopped early (Ctrl-C): the requests in flight then were cancelled and are not in ``records``."""


__all__ = ["RequestRecord", "Target", "TargetRun", "distinct"]
