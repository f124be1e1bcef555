"""TensorRT-LLM's cumulative ``RequestOutput`` → generation events: pure, duck-typed.

A streaming ``RequestOutput`` is one object that TensorRT-LLM mutates and yields again at
every step: each ``CompletionOutput`` holds *all* token ids, text and logprobs so far.
``RequestStream.events`` turns each step into deltas (``spi.CumulativeOutput``) before the
object changes again. Per output it also

* matches caller stop strings (``spi.StopTextMatcher``, only from ``min_tokens`` on), holding
  back a partial match while streaming; TensorRT-LLM never sees the strings (``mapping``);
* reports caller stop tokens as TensorRT-LLM left them (dropped unless included) and the
  model's EOS as a record without text, adding it when TensorRT-LLM's output omits it;
* aligns logprobs from the end of the ids: a decode engine's first token (the prefill's)
  comes without one.

Logprob rows are TensorRT-LLM's ``{token_id: Logprob(logprob, rank)}`` top-k dicts or, in its
simple form, one float per token. ``TorchSampler`` adds the sampled token to its row, with its
rank, when it falls outside the top-k: the record keeps it and the candidates are cut to the
top N asked for; a row without the sampled token leaves the record without a logprob.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    CandidateSelection,
    CumulativeOutput,
    GenerationEvent,
    GenerationRequest,
    KvSession,
    OutputFinished,
    PrefillDone,
    StopMatch,
    StopTextHit,
    StopTextMatcher,
    TokenDelta,
    TokenRecord,
    UsageReport,
    select_candidates,
    stop_match_for_token,
)

from .mapping import prefill_session

Decode = Callable[[int], str]

_CANCELLED = {"cancelled": "cancelled by TensorRT-LLM", "timeout": "timed out in TensorRT-LLM"}


class _Output:
    """One output's streaming state."""

    __slots__ = ("cumulative", "finished", "generated", "matcher", "shortfall")

    def __init__(self, matcher: StopTextMatcher) -> None:
        self.cumulative = CumulativeOutput()
        self.matcher = matcher
        self.generated = 0
        self.finished = False
        self.shortfall: int | None = None


class RequestStream:
    """Per-request state that turns TensorRT-LLM's cumulative outputs into events."""

    __slots__ = (
        "_decode",
        "_end_id",
        "_outputs",
        "_prefill",
        "_reported",
        "_request",
        "_transfer_backend",
        "session",
    )

    def __init__(
        self,
        request: GenerationRequest,
        *,
        end_id: int | None,
        decode: Decode = lambda _: "",
        prefill: bool = False,
        transfer_backend: str = "",
    ) -> None:
        self._request = request
        self._end_id = end_id
        self._decode = decode
        self._prefill = prefill
        self._transfer_backend = transfer_backend
        stopping = request.stopping
        self._outputs = [
            _Output(StopTextMatcher(stopping.stop_texts, include_stop=stopping.include_stop_in_output))
            for _ in range(request.sampling.num_sequences)
        ]
        self._reported = False
        self.session: KvSession | None = None
        """The prefill's handoff, once TensorRT-LLM reported it."""

    @property
    def done(self) -> bool:
        """Every output finished (or the prefill handed off): nothing more to stream."""
        return self.session is not None or all(output.finished for output in self._outputs)

    def unfinished(self) -> list[int]:
        """Indexes of the outputs still open."""
        return [index for index, output in enumerate(self._outputs) if not output.finished]

    def events(self, result: Any) -> list[GenerationEvent]:
        """The events for one step of a ``RequestOutput`` (read now: it changes in place)."""
        events: list[GenerationEvent] = []
        if not self._reported:  # the prompt's counts, for a stream cut short before any finish
            self._reported = True
            events.append(self.usage(result))
        if self._prefill:
            self._handoff(result, events)
            return events
        for completion in result.outputs:
            if not self._outputs[completion.index].finished:
                self._completion(completion, result, events)
        return events

    def usage(self, result: Any) -> UsageReport:
        """Cumulative counts: prompt, every generated token (dropped stop tokens too), cache hits."""
        cached = getattr(result, "cached_tokens", None)
        return UsageReport(
            prompt_tokens=len(result.prompt_token_ids),
            completion_tokens=sum(output.generated for output in self._outputs),
            cached_prompt_tokens=None if cached is None else int(cached),
        )

    def _completion(self, completion: Any, result: Any, events: list[GenerationEvent]) -> None:
        index: int = completion.index
        state = self._outputs[index]
        reason = completion.finish_reason
        token_ids: Sequence[int] = completion.token_ids or ()
        new_ids, new_text = state.cumulative.update(token_ids, completion.text or "", final=reason is not None)
        first = state.cumulative.tokens_sent - len(new_ids)
        records = self._records(state, completion, first, new_ids)
        fed = self._match(state, new_ids, new_text)
        state.generated += len(new_ids)
        if isinstance(fed, StopTextHit):
            stop = OutputFinished(index, pb.FINISH_REASON_STOP, StopMatch.text(fed.stop))
            events.extend(self._close(index, records, fed.text, stop, result))
            return
        if reason is None:
            if records or fed:
                events.append(TokenDelta(index, records, fed))
            return
        text = fed + state.matcher.flush()
        finished = self._finished(index, reason, completion.stop_reason, token_ids, records)
        events.extend(self._close(index, records, text, finished, result))

    def _close(
        self, index: int, records: list[TokenRecord], text: str, finished: OutputFinished, result: Any
    ) -> list[GenerationEvent]:
        """The output's last delta, the request's usage so far, and the output's finish."""
        self._outputs[index].finished = True
        delta: list[GenerationEvent] = [TokenDelta(index, records, text)] if records or text else []
        return [*delta, self.usage(result), finished]

    def _finished(
        self, index: int, reason: str, stop_reason: Any, token_ids: Sequence[int], records: list[TokenRecord]
    ) -> OutputFinished:
        """The finish for TensorRT-LLM's reason; adds the EOS record TensorRT-LLM left out."""
        if reason == "length":
            return OutputFinished(index, pb.FINISH_REASON_LENGTH)
        if reason in _CANCELLED:
            return OutputFinished(index, pb.FINISH_REASON_CANCELLED, message=_CANCELLED[reason])
        if reason != "stop":
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"TensorRT-LLM finished output {index} with {reason!r}")
        if isinstance(stop_reason, str):  # never sent to TensorRT-LLM (stop strings are matched here)
            return OutputFinished(index, pb.FINISH_REASON_STOP, StopMatch.text(stop_reason))
        token_id = stop_reason if isinstance(stop_reason, int) else self._end_id
        if token_id is None:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"TensorRT-LLM stopped output {index} on an unknown token")
        stopping = self._request.stopping
        match = stop_match_for_token(token_id, stopping, (token_id,)) or StopMatch.eos(token_id)
        present = bool(token_ids) and token_ids[-1] == token_id
        if match.eos_token_id is not None and not present:
            records.append(TokenRecord(token_id))  # TensorRT-LLM's executor leaves EOS out
            self._outputs[index].generated += 1
        elif match.stop_token_id is not None and not present:
            self._outputs[index].generated += 1  # sampled, then dropped by TensorRT-LLM as asked
        return OutputFinished(index, pb.FINISH_REASON_STOP, match)

    def _match(self, state: _Output, new_ids: Sequence[int], new_text: str) -> str | StopTextHit:
        """Stop strings may complete only in the text of tokens past ``min_tokens`` (as in vLLM).

        A step of several tokens that crosses that boundary is split where the text of its
        tokens up to it ends (per token decoded: TensorRT-LLM gives the step's text whole).
        """
        unarmed = min(max(self._request.stopping.min_tokens - state.generated, 0), len(new_ids))
        if not unarmed:
            return state.matcher.feed(new_text)
        if unarmed == len(new_ids):
            return state.matcher.feed(new_text, armed=False)
        cut = min(len(new_text), sum(len(self._decode(token)) for token in new_ids[:unarmed]))
        before = state.matcher.feed(new_text[:cut], armed=False)
        assert isinstance(before, str)  # unarmed text completes no stop string
        after = state.matcher.feed(new_text[cut:])
        if isinstance(after, StopTextHit):
            return StopTextHit(before + after.text, after.stop)
        return before + after

    def _records(self, state: _Output, completion: Any, first: int, new_ids: Sequence[int]) -> list[TokenRecord]:
        wanted = self._request.output_logprobs
        if wanted is None:
            return [TokenRecord(token_id) for token_id in new_ids]
        rows: Sequence[Any] = completion.logprobs or ()
        if state.shortfall is None and rows:
            state.shortfall = max(0, len(completion.token_ids) - len(rows))
        shortfall = state.shortfall or 0
        return [
            position_record(token_id, _row(rows, position - shortfall), wanted.candidates, self._decode)
            for position, token_id in enumerate(new_ids, start=first)
        ]

    def _handoff(self, result: Any, events: list[GenerationEvent]) -> None:
        """A context-only request ends with the parameters the generation side needs."""
        for completion in result.outputs:
            state = self._outputs[completion.index]
            state.generated = len(completion.token_ids or ())
            params = getattr(completion, "disaggregated_params", None)
            if params is not None and getattr(params, "ctx_request_id", None) is not None:
                self.session = prefill_session(params, transfer_backend=self._transfer_backend)
                events.extend((self.usage(result), PrefillDone(self.session)))
                return
            if completion.finish_reason in _CANCELLED:
                raise EngineFailure(pb.ERROR_CODE_CANCELLED, f"the prefill was {_CANCELLED[completion.finish_reason]}")
        if result.finished:
            raise EngineFailure(
                pb.ERROR_CODE_KV_TRANSFER_FAILED, "TensorRT-LLM ended the context phase without a handoff"
            )


def _row(rows: Sequence[Any], index: int) -> Any:
    return rows[index] if 0 <= index < len(rows) else None


def position_record(token_id: int, row: Any, selection: CandidateSelection | None, decode: Decode) -> TokenRecord:
    """One token's record from its logprob row: a top-k dict, a float, or None (unscored)."""
    text = decode(token_id)
    if row is None:
        return TokenRecord(token_id, text)
    if not isinstance(row, dict):
        return TokenRecord(token_id, text, float(row))
    chosen = row.get(token_id)
    values = {candidate: entry.logprob for candidate, entry in row.items()}
    ranks = {candidate: entry.rank for candidate, entry in row.items()}
    known = None if None in ranks.values() else ranks
    candidates = select_candidates(selection, values, decode=decode, ranks=known)
    if chosen is None:
        return TokenRecord(token_id, text, candidates=candidates)
    return TokenRecord(token_id, text, chosen.logprob, chosen.rank, candidates)


__all__ = ["Decode", "RequestStream", "position_record"]
