"""``OutputTracker``: one output of a token-by-token engine, from sampled tokens to events.

An engine that hands the driver one token at a time (its id and its text or bytes) leaves the
driver every stopping and text chore of the contract: a caller's stop token (kept only with
``include_stop_in_output``), the model's EOS (in the records, without text, unless
``ignore_eos``), stop strings (a partial match held back, the output cut at a match),
``min_tokens`` (nothing ends the output before it), the budget (LENGTH) and byte pieces that
split a UTF-8 character. The tracker does all of it with the ``streaming`` helpers
(``StopTextMatcher``, ``stop_match_for_token``): ``add`` each token, emit the step's delta, and
its finish when there is one.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass

from .. import pb
from .events import OutputFinished, StopMatch, TokenDelta, TokenRecord
from .requests import Stopping
from .streaming import StopTextHit, StopTextMatcher, stop_match_for_token


@dataclass(frozen=True, slots=True)
class TokenStep:
    """What one token produced: the delta to emit (possibly empty), then ``finish`` when the output ended."""

    delta: TokenDelta
    finish: OutputFinished | None = None


class OutputTracker:
    """Stopping and text of output ``index``, one generated token at a time.

    ``budget`` is the output's token budget (``resolve_max_tokens``); ``eos_token_ids`` the model's
    end-of-sequence ids. Pieces are ``str`` (the token's text) or ``bytes`` (its UTF-8 bytes,
    possibly part of a character: held back until the character completes)::

        tracker = OutputTracker(0, request.stopping, budget=budget, eos_token_ids=eos)
        while not tracker.done:
            token = await engine.next_token(ban_stops=not tracker.may_stop)
            step = tracker.add(token, tokenizer.piece(token))
            yield step.delta
            yield UsageReport(prompt_tokens, tracker.generated)
            if step.finish is not None:
                yield step.finish
    """

    __slots__ = ("_budget", "_eos", "_generated", "_index", "_matcher", "_stopping", "_utf8", "done")

    def __init__(self, index: int, stopping: Stopping, *, budget: int, eos_token_ids: Sequence[int] = ()) -> None:
        self._index = index
        self._stopping = stopping
        self._eos = tuple(eos_token_ids)
        self._matcher = StopTextMatcher(stopping.stop_texts, include_stop=stopping.include_stop_in_output)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._generated = 0
        self._budget = budget
        self.done = False
        """The output ended: ``add`` takes no more tokens."""

    @property
    def generated(self) -> int:
        """Tokens the engine generated for this output: its ``completion_tokens``, a dropped stop token included."""
        return self._generated

    @property
    def may_stop(self) -> bool:
        """Whether the next token may end the output (``min_tokens`` reached): until then an engine
        that can should ban EOS and the caller's stop tokens from sampling."""
        return self._generated >= self._stopping.min_tokens

    def add(self, token_id: int, piece: str | bytes, record: TokenRecord | None = None) -> TokenStep:
        """Take the next generated token; ``record`` (default: the bare id) carries its logprobs."""
        if self.done:
            raise ValueError(f"output {self._index} already ended")
        armed = self.may_stop
        self._generated += 1
        if record is None:
            record = TokenRecord(token_id)
        stop = stop_match_for_token(token_id, self._stopping, self._eos) if armed else None
        if stop is not None:  # a caller's stop token stays (record and text) only when included; EOS without text
            caller = stop.stop_token_id is not None
            kept = not caller or self._stopping.include_stop_in_output
            text = self._decode(piece) if caller and kept else ""
            delta = TokenDelta(self._index, [record] if kept else [], self._matcher.flush() + text + self._rest())
            return self._end(delta, pb.FINISH_REASON_STOP, stop)
        fed = self._matcher.feed(self._decode(piece), armed=armed)
        if isinstance(fed, StopTextHit):
            return self._end(
                TokenDelta(self._index, [record], fed.text), pb.FINISH_REASON_STOP, StopMatch.text(fed.stop)
            )
        if self._generated >= self._budget:
            delta = TokenDelta(self._index, [record], fed + self._matcher.flush() + self._rest())
            return self._end(delta, pb.FINISH_REASON_LENGTH)
        return TokenStep(TokenDelta(self._index, [record], fed))

    def _decode(self, piece: str | bytes) -> str:
        return self._utf8.decode(piece) if isinstance(piece, bytes) else piece

    def _rest(self) -> str:
        """Bytes of an unfinished character at the output's end, as U+FFFD."""
        return self._utf8.decode(b"", final=True)

    def _end(self, delta: TokenDelta, reason: pb.FinishReason.ValueType, stop: StopMatch | None = None) -> TokenStep:
        self.done = True
        return TokenStep(delta, OutputFinished(self._index, reason, stop))


__all__ = ["OutputTracker", "TokenStep"]
