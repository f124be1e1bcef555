"""vLLM ``RequestOutput`` deltas → generation events: pure, duck-typed, no vLLM import.

The engine runs every request with ``RequestOutputKind.DELTA`` and ``flat_logprobs``: each
``RequestOutput`` carries only new token ids, new text and new logprob positions per
``CompletionOutput``, and the prompt logprobs once. ``RequestStream.events`` turns one such
output into the SPI events. Logprobs arrive in either of vLLM's shapes: ``FlatLogprobs``
(parallel lists indexed by ``start_indices``/``end_indices``) or a list of ``{token_id:
Logprob}`` dicts; each position starts with the chosen token (with its true vocabulary rank),
followed by the requested candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    GenerationEvent,
    GenerationRequest,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
    stop_match_for_token,
)

from .mapping import causal_row, prefill_session

_TOKEN_IDS = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS


class RequestStream:
    """Per-request state that turns vLLM's delta outputs into events.

    The per-token work is the minimum the contract asks for: one ``TokenRecord`` per token,
    built from vLLM's own logprob arrays when logprobs were requested. Token text pieces come
    from vLLM's decoded logprob tokens; without logprobs a record carries the id only and the
    delta's text carries the text.
    """

    __slots__ = (
        "_counts",
        "_dp_rank",
        "_eos",
        "_last_token",
        "_output_ids",
        "_prefill",
        "_prompt_ids",
        "_prompt_sent",
        "_request",
        "_token_text",
        "_transfer_backend",
    )

    def __init__(
        self,
        request: GenerationRequest,
        *,
        eos_token_ids: Sequence[int],
        prefill: bool = False,
        transfer_backend: str = "",
        dp_rank: int = 0,
        token_text: Callable[[int], str] | None = None,
    ) -> None:
        """``token_text`` decodes a prompt token vLLM reports no text for (the first)."""
        self._request = request
        self._token_text = token_text
        self._eos = tuple(eos_token_ids)
        self._prefill = prefill
        self._transfer_backend = transfer_backend
        self._dp_rank = dp_rank
        self._counts = [0] * request.sampling.num_sequences
        self._last_token = [-1] * request.sampling.num_sequences
        selection = request.output_logprobs.candidates if request.output_logprobs else None
        self._output_ids = selection.token_ids if selection and selection.mode == _TOKEN_IDS else None
        self._prompt_sent = request.prompt_logprobs is None
        self._prompt_ids: Sequence[int] = ()

    def events(self, output: Any) -> list[GenerationEvent]:
        """The events for one ``RequestOutput`` (a delta)."""
        events: list[GenerationEvent] = []
        if not self._prompt_sent and output.prompt_logprobs:
            self._prompt_sent = True
            events.append(self._prompt(output))
        first = not self._prompt_ids
        self._prompt_ids = output.prompt_token_ids or self._prompt_ids
        if self._prefill:
            self._counts[0] += sum(len(completion.token_ids) for completion in output.outputs)
            if output.finished:
                self._prefill_done(output, events)
            return events
        for completion in output.outputs:
            self._completion(completion, output, events)
        if first and not output.finished:
            events.append(self.usage(output))  # a request cut short (aborted) still counts its prompt
        return events

    def usage(self, output: Any) -> UsageReport:
        """Cumulative counts: prompt, generated tokens (stop tokens included), cache hits."""
        return UsageReport(
            prompt_tokens=len(output.prompt_token_ids or self._prompt_ids),
            completion_tokens=sum(self._counts),
            cached_prompt_tokens=output.num_cached_tokens,
        )

    def _completion(self, completion: Any, output: Any, events: list[GenerationEvent]) -> None:
        index: int = completion.index
        if completion.finish_reason == "error":
            raise self._error(index)  # a token it carries is one vLLM's grammar rejected: not emitted or counted
        token_ids: Sequence[int] = completion.token_ids
        if token_ids:
            self._counts[index] += len(token_ids)
            self._last_token[index] = token_ids[-1]
        records = self._records(token_ids, completion.logprobs)
        finished = completion.finish_reason is not None
        stop = self._stop_match(index, completion) if completion.finish_reason == "stop" else None
        if (
            stop is not None
            and stop.stop_token_id is not None
            and not self._request.stopping.include_stop_in_output
            and records
        ):
            records.pop()
        if records or completion.text:
            events.append(TokenDelta(index, records, completion.text))
        if finished:
            events.append(self.usage(output))
            events.append(self._finished(index, completion, stop))

    def _records(self, token_ids: Sequence[int], logprobs: Any) -> list[TokenRecord]:
        if not logprobs:
            return [TokenRecord(token_id) for token_id in token_ids]
        rows = logprob_rows(logprobs)
        return [position_record(row, self._output_ids) for row in rows]

    def _stop_match(self, index: int, completion: Any) -> StopMatch:
        reason = completion.stop_reason
        if isinstance(reason, str):
            return StopMatch.text(reason)
        token_id = reason if isinstance(reason, int) else self._last_token[index]
        match = stop_match_for_token(token_id, self._request.stopping, self._eos)
        return match if match is not None else StopMatch.eos(token_id)

    def _finished(self, index: int, completion: Any, stop: StopMatch | None) -> OutputFinished:
        reason = completion.finish_reason
        if reason == "stop":
            return OutputFinished(index, pb.FINISH_REASON_STOP, stop)
        if reason == "length":
            return OutputFinished(index, pb.FINISH_REASON_LENGTH)
        if reason == "abort":
            return OutputFinished(index, pb.FINISH_REASON_CANCELLED, message="aborted by the engine")
        if reason == "error":
            raise self._error(index)
        raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"vLLM finished output {index} with reason {reason!r}")

    def _error(self, index: int) -> EngineFailure:
        """What vLLM's bare ``error`` finish means for this request.

        vLLM gives no reason with it. A decode's is its KV transfer (vLLM fails a request whose KV
        load failed before its first token, guided or not). Otherwise a guided output failing
        before its first token is the grammar that vLLM accepted but could not compile (the
        scheduler fails such a request while it waits for its grammar), and one failing later
        under ``min_tokens`` is a guide that allowed only tokens the ban excluded (the sampler
        then picks a token outside the grammar, which the scheduler rejects): the caller's
        error both times, and retrying fails again. Anything else is an engine-side failure
        worth a retry.
        """
        if self._request.kv_session is not None:
            return EngineFailure(
                pb.ERROR_CODE_KV_TRANSFER_FAILED,
                "vLLM could not load the prefilled KV",
                retryable=True,
                retry_after_ms=0,
            )
        if self._request.guidance is not None:
            if self._counts[index] == 0:
                return EngineFailure(
                    pb.ERROR_CODE_INVALID_ARGUMENT, "vLLM could not compile the guided-decoding grammar"
                )
            if self._counts[index] < self._request.stopping.min_tokens:
                return EngineFailure(
                    pb.ERROR_CODE_INVALID_ARGUMENT,
                    f"output {index}: the guide allowed only tokens that min_tokens still banned (stop tokens or "
                    "EOS), and vLLM failed the output",
                )
        return EngineFailure(
            pb.ERROR_CODE_INTERNAL, "vLLM reported a retryable request error", retryable=True, retry_after_ms=0
        )

    def _prefill_done(self, output: Any, events: list[GenerationEvent]) -> None:
        """The prefill's one token is not emitted; its final transfer parameters are."""
        reason = output.outputs[0].finish_reason if output.outputs else None
        if reason == "abort":
            raise EngineFailure(pb.ERROR_CODE_CANCELLED, "the prefill was aborted by the engine")
        if reason not in ("stop", "length"):
            self._finished(0, output.outputs[0], None)
        events.append(self.usage(output))
        session = prefill_session(
            self._request.request_id,
            output.kv_transfer_params,
            transfer_backend=self._transfer_backend,
            dp_rank=self._dp_rank,
        )
        events.append(PrefillDone(session))

    def _prompt(self, output: Any) -> PromptTokens:
        request = self._request
        assert request.prompt_logprobs is not None
        selection = request.prompt_logprobs.candidates
        explicit = selection.token_ids if selection and selection.mode == _TOKEN_IDS else None
        return PromptTokens(
            prompt_records(
                output.prompt_token_ids,
                output.prompt_logprobs,
                start=request.prompt_logprob_start,
                explicit_ids=explicit,
                explicit_scores=getattr(output, "prompt_token_id_logprobs", None),
                token_text=self._token_text,
            )
        )


def logprob_rows(logprobs: Any) -> list[list[tuple[int, float, int | None, str | None]]]:
    """Each position's ``(token_id, logprob, rank, decoded_token)`` entries, chosen token first.

    Reads ``FlatLogprobs`` without building vLLM's per-position dicts; a list of dicts (or
    None for the unscored first prompt position) is read as it is.
    """
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:
        ids, values, ranks, texts = logprobs.token_ids, logprobs.logprobs, logprobs.ranks, logprobs.decoded_tokens
        return [
            [(ids[i], values[i], ranks[i], texts[i]) for i in range(start, end)]
            for start, end in zip(starts, logprobs.end_indices, strict=True)
        ]
    return [
        [(token_id, entry.logprob, entry.rank, entry.decoded_token) for token_id, entry in position.items()]
        if position
        else []
        for position in logprobs
    ]


def position_record(
    row: Sequence[tuple[int, float, int | None, str | None]], explicit_ids: Sequence[int] | None
) -> TokenRecord:
    """One token's record from its logprob entries (chosen token first, then candidates).

    vLLM reports true vocabulary ranks for the chosen token and for top-N / all candidates; for
    explicit candidate ids (``logprob_token_ids``) its ranks are list positions, so those
    candidates carry no rank and come in the requested order. vLLM's list-of-dicts form keeps a
    chosen token that is also a candidate only once; it is put back at its rank.
    """
    token_id, logprob, rank, text = row[0]
    if explicit_ids is not None:
        found = {entry[0]: entry for entry in row}
        candidates = [Candidate(i, found[i][1], found[i][3] or "") for i in explicit_ids if i in found]
        return TokenRecord(token_id, text or "", logprob, rank, candidates)
    rest = row[1:]
    candidates = [Candidate(cid, clp, ctext or "", crank) for cid, clp, crank, ctext in rest]
    last_rank = rest[-1][2] if rest else None
    if (
        rank is not None
        and last_rank is not None
        and rank <= last_rank
        and all(candidate.token_id != token_id for candidate in candidates)
    ):
        candidates.insert(rank - 1, Candidate(token_id, logprob, text or "", rank))
    return TokenRecord(token_id, text or "", logprob, rank, candidates)


def prompt_records(
    prompt_ids: Sequence[int],
    prompt_logprobs: Any,
    *,
    start: int,
    explicit_ids: Sequence[int] | None = None,
    explicit_scores: Any = None,
    token_text: Callable[[int], str] | None = None,
) -> list[TokenRecord]:
    """Prompt tokens from position ``start`` on; the first prompt token has no logprob.

    ``explicit_scores`` is vLLM's ``prompt_token_id_logprobs`` (rows from ``causal_row(start)``
    on, one column per explicit id) when candidates were selected by id. ``token_text`` gives
    the text of a position vLLM scored nothing for (the first), which vLLM leaves undecoded.
    """
    rows = logprob_rows(prompt_logprobs)
    first_row = causal_row(start)
    records: list[TokenRecord] = []
    for position in range(start, len(prompt_ids)):
        row = rows[position] if position < len(rows) else []
        if not row:
            token_id = prompt_ids[position]
            records.append(TokenRecord(token_id, token_text(token_id) if token_text is not None else ""))
            continue
        record = position_record(row, None)
        if explicit_ids is not None:
            scores = [] if explicit_scores is None else explicit_scores[position - 1 - first_row]
            record.candidates = [Candidate(cid, float(score)) for cid, score in zip(explicit_ids, scores, strict=False)]
        records.append(record)
    return records


__all__ = ["RequestStream", "logprob_rows", "position_record", "prompt_records"]
