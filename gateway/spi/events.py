"""Generation events a driver emits, and the stream that carries them to the gateway.

A driver turns one ``GenerationRequest`` into a sequence of small events. It does not build
``GenerateResponse`` messages: the core's encoder (``contract.stream``) does, and owns every
stream invariant (output_index on every output-scoped event, one terminal event per output,
usage only on the final response, nothing after a terminal error). A driver that breaks the
event protocol gets a terminal ``ERROR_CODE_INTERNAL`` instead of a malformed stream.

The protocol, per request:

* ``PromptTokens`` at most once, only when prompt logprobs were requested;
* ``TokenDelta`` per output with *new* tokens and *new* text only (never cumulative);
* ``UsageReport`` whenever counts are known, and at least once before the final event;
* ``OutputFinished`` exactly once per output (aggregated and decode engines), or
  ``PrefillDone`` once (prefill engines);
* failures are raised as ``EngineFailure`` (or ``EventStream.fail``).

``EventStream`` is what ``Backend.generate`` returns, the one hand-off point: engine-loop
drivers ``put`` into it directly; a driver that awaits its engine per request writes an async
generator and returns ``EventStream.from_iterator(generator)``. It coalesces: when the client
reads slower than the engine produces, ready tokens of one output merge into one
``TokenDelta`` (so one message), while an idle stream delivers each event at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from .. import pb
from .requests import KvSession


@dataclass(slots=True)
class Candidate:
    """One candidate token at a position, with its logprob and (when known) rank (1-based)."""

    token_id: int
    logprob: float
    token: str = ""
    rank: int | None = None


@dataclass(slots=True)
class TokenRecord:
    """One prompt or output token: its id, text piece, logprob, rank and candidates together.

    Keeping them in one record is what makes positional misalignment impossible. The first
    prompt token has no logprob, rank or candidates.
    """

    token_id: int
    token: str = ""
    logprob: float | None = None
    rank: int | None = None
    candidates: Sequence[Candidate] = ()


@dataclass(slots=True)
class PromptTokens:
    """The prompt's tokens with logprobs (from ``prompt_logprob_start`` on)."""

    tokens: list[TokenRecord]


@dataclass(slots=True)
class TokenDelta:
    """New tokens and new text of one output. Mutable: ``EventStream`` merges into it."""

    index: int
    tokens: list[TokenRecord]
    text: str = ""


@dataclass(frozen=True, slots=True)
class StopMatch:
    """What ended an output with FINISH_REASON_STOP: exactly one field is set."""

    stop_token_id: int | None = None
    stop_text: str | None = None
    eos_token_id: int | None = None

    @classmethod
    def token(cls, token_id: int) -> StopMatch:
        """A caller-supplied stop token matched."""
        return cls(stop_token_id=token_id)

    @classmethod
    def text(cls, text: str) -> StopMatch:
        """A caller-supplied stop string matched."""
        return cls(stop_text=text)

    @classmethod
    def eos(cls, token_id: int) -> StopMatch:
        """The model's own end-of-sequence token."""
        return cls(eos_token_id=token_id)


@dataclass(frozen=True, slots=True)
class OutputFinished:
    """Output ``index`` is complete. ``stop`` is required when ``reason`` is STOP."""

    index: int
    reason: pb.FinishReason.ValueType
    stop: StopMatch | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """A prefill engine built the KV state; a decode engine may attach with ``session``."""

    session: KvSession


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Cumulative token counts across every output of the request (latest report wins)."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int | None = None
    reasoning_tokens: int | None = None


GenerationEvent = PromptTokens | TokenDelta | OutputFinished | PrefillDone | UsageReport


class EventStream:
    """A per-request mailbox of generation events with adaptive coalescing.

    The producer (an engine loop, or the task ``from_iterator`` starts) calls ``put``,
    ``finish`` or ``fail``; all three are synchronous and never block. The consumer iterates.
    ``put`` never grows the queue for a token of an output that already has an unconsumed
    ``TokenDelta`` waiting: the tokens join that delta, which is how a lagging client gets
    fewer, larger messages. The queue is bounded by the request itself (its outputs and
    ``max_tokens``). Events must not be touched by the producer after ``put``.

    ``cancel`` (core only) drops what is pending and ends the stream at once; the core then
    finishes every open output as CANCELLED. The latest usage report outlives it (the final
    response still counts what the request used). A ``PrefillDone`` that will never be read
    (dropped by ``cancel``, or put after the stream closed) goes to ``on_abandoned``: no
    client knows its session's id, so only the core can release the KV it holds.
    """

    __slots__ = ("_closed", "_error", "_pending", "_waiter", "cancelled", "meter", "on_abandoned", "producer")

    def __init__(self) -> None:
        self._pending: deque[GenerationEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._error: BaseException | None = None
        self.cancelled = False
        self.on_abandoned: Callable[[KvSession], object] | None = None
        """Called with the session of each ``PrefillDone`` nobody will read."""
        self.producer: asyncio.Task[None] | None = None
        """The task draining a driver's iterator into this stream (``from_iterator``), if any."""
        self.meter: Callable[[int], BaseException | None] | None = None
        """Set by the core: told how many unread entries (tokens and candidates) each put adds and
        each read removes; an error it returns ends the stream now, its pending events dropped
        (``core.unread``: a client that reads too slowly holds a bounded amount)."""

    @classmethod
    def from_iterator(cls, source: AsyncIterator[GenerationEvent]) -> EventStream:
        """A stream fed by ``source`` (a driver's async generator) on a task of its own.

        The task decouples the engine from the client's pace (the stream coalesces while the
        client lags) and gives the core one place to stop the generator: ``detach`` closes it
        at once (its ``finally`` runs), and after ``cancel`` it is closed at its next event. A
        failure it raises ends the stream after the events before it.
        """
        stream = cls()
        stream.producer = asyncio.create_task(stream._drain(source))
        return stream

    async def _drain(self, source: AsyncIterator[GenerationEvent]) -> None:
        try:
            async for event in source:
                if self._closed:
                    break
                self.put(event)
            self.finish()
        except asyncio.CancelledError:
            self.cancel()
            raise
        except BaseException as exc:  # broad on purpose: the consumer reports it as EngineError
            self.fail(exc)
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    def detach(self) -> None:
        """The consumer is done reading (core only): stop the producer task, if any, which
        closes the driver's iterator. An engine loop's stream is left as it is."""
        if self.producer is not None:
            self.producer.cancel()

    @property
    def closed(self) -> bool:
        """True once finished, failed or cancelled; later puts are ignored."""
        return self._closed

    def put(self, event: GenerationEvent) -> None:
        """Queue an event, merging token deltas of the same output that are still unread."""
        if self._closed:
            if type(event) is PrefillDone:
                self._abandon(event)
            return
        meter = self.meter
        if meter is not None and type(event) in (TokenDelta, PromptTokens):
            overflow = meter(_entries(event))  # type: ignore[arg-type]
            if overflow is not None:
                self.cancel()
                self._error = overflow
                return
        pending = self._pending
        if pending and type(event) is TokenDelta:
            for queued in reversed(pending):
                if type(queued) is not TokenDelta:
                    break
                if queued.index == event.index:
                    queued.tokens.extend(event.tokens)
                    queued.text += event.text
                    return
        pending.append(event)
        self._wake()

    def finish(self) -> None:
        """The producer is done; the consumer drains what is pending, then stops."""
        self._closed = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End with ``error`` after the pending events (an ``EngineFailure`` or a bug)."""
        if not self._closed:
            self._error = error
            self._closed = True
            self._wake()

    def cancel(self) -> None:
        """Drop pending events but the latest usage and end now (the request was aborted), even after ``fail``."""
        self.cancelled = True
        pending = self._pending
        for event in pending:
            if type(event) is PrefillDone:
                self._abandon(event)
        usage = next((event for event in reversed(pending) if type(event) is UsageReport), None)
        pending.clear()
        if usage is not None:
            pending.append(usage)
        self._error = None
        self._closed = True
        self._wake()

    def _abandon(self, event: PrefillDone) -> None:
        if self.on_abandoned is not None:
            self.on_abandoned(event.session)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        while not self._pending:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._pending.popleft()
        if self.meter is not None and type(event) in (TokenDelta, PromptTokens):
            self.meter(-_entries(event))  # type: ignore[arg-type]
        return event


def _entries(event: TokenDelta | PromptTokens) -> int:
    """What an event holds unread, in entries: one per token and one per candidate."""
    tokens = event.tokens
    count = len(tokens)
    for record in tokens:
        if record.candidates:
            count += len(record.candidates)
    return count


__all__ = [
    "Candidate",
    "EventStream",
    "GenerationEvent",
    "OutputFinished",
    "PrefillDone",
    "PromptTokens",
    "StopMatch",
    "TokenDelta",
    "TokenRecord",
    "UsageReport",
]
