"""SGLang's streamed output dictionaries → generation events: pure, duck-typed, no SGLang import.

SGLang's ``TokenizerManager.generate_request`` (what ``Engine.async_generate(stream=True)``
returns) yields, per SGLang request, dictionaries with cumulative ``text`` and ``output_ids``
(SGLang's default streaming) and a ``meta_info`` with ``id``, ``finish_reason`` (``None`` or
``{"type": "stop" | "length" | "abort", ...}``), ``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, ``reasoning_tokens`` and, when logprobs were asked for, cumulative lists:
``output_token_logprobs`` as ``(logprob, token_id, text)`` tuples, ``output_top_logprobs`` and
``output_token_ids_logprobs`` as lists of such tuples per position, and the ``input_*``
equivalents whose first entry has no logprob. ``RequestStream`` keeps one ``CumulativeOutput``
per output to emit only what is new.

SGLang leaves a matched stop or EOS token in ``output_ids`` and trims its text unless told
not to (``no_stop_trim``); a caller's stop token record is dropped here unless the caller
asked to include it, while EOS stays as a record without text. SGLang's ``ignore_eos`` disables
every token stop, so with ``ignore_eos`` the caller's stop tokens are watched for here: the
output ends at the first one past ``min_tokens``, its text decoded through (or up to) it, and
the engine then closes SGLang's stream, which aborts the rest of the request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    CumulativeOutput,
    GenerationEvent,
    GenerationRequest,
    OutputFinished,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
    stop_match_for_token,
)

from .mapping import prompt_logprob_row

Entry = Sequence[Any]
"""SGLang's ``(logprob, token_id, text)``; the logprob is None for the first prompt token."""

_IDS, _ALL = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL


class RequestStream:
    """Per-request state that turns each output's cumulative SGLang dictionaries into events."""

    __slots__ = (
        "_cached",
        "_completion",
        "_decode",
        "_done",
        "_eos",
        "_outputs",
        "_prompt_ids",
        "_prompt_sent",
        "_prompt_tokens",
        "_reasoning",
        "_request",
        "_usage_sent",
        "_watched",
    )

    def __init__(
        self,
        request: GenerationRequest,
        *,
        eos_token_ids: Sequence[int],
        prompt_ids: Sequence[int] | None,
        reasoning: bool = False,
        decode: Callable[[Sequence[int]], str] = lambda _: "",
    ) -> None:
        count = request.sampling.num_sequences
        stopping = request.stopping
        self._request = request
        self._decode = decode
        self._watched = frozenset(stopping.stop_token_ids) if stopping.ignore_eos else frozenset()
        self._done: set[int] = set()
        self._eos = tuple(eos_token_ids)
        self._outputs = [CumulativeOutput() for _ in range(count)]
        self._prompt_sent = request.prompt_logprobs is None
        self._prompt_ids = prompt_ids
        """The prompt as the engine tokenized it (None for a multimodal prompt: SGLang expands it)."""
        self._prompt_tokens = None if prompt_ids is None else len(prompt_ids)
        self._completion = [0] * count
        self._cached: list[int | None] = [None] * count
        self._reasoning: list[int] | None = [0] * count if reasoning else None
        self._usage_sent = False

    def finished(self, index: int) -> bool:
        """Output ``index`` has had its ``OutputFinished`` (its SGLang stream can be closed)."""
        return index in self._done

    def events(self, index: int, out: Mapping[str, Any]) -> list[GenerationEvent]:
        """The events of output ``index`` for one of its SGLang dictionaries."""
        meta: Mapping[str, Any] = out["meta_info"]
        events: list[GenerationEvent] = []
        ids: Sequence[int] = out.get("output_ids") or ()
        text: str = out.get("text") or ""
        reason = meta.get("finish_reason")
        cumulative = self._outputs[index]
        start = cumulative.tokens_sent
        watched = self._watched_stop(ids, start)
        if watched is not None:
            ids = ids[: watched + 1]
            include = self._request.stopping.include_stop_in_output
            text = self._decode(ids if include else ids[:-1])
            reason = {"type": "stop", "matched": ids[-1]}
        self._count(index, meta, len(ids), watched is not None)
        if not self._usage_sent:  # once, up front: a request aborted mid-stream still reports its prompt
            self._usage_sent = True
            events.append(self.usage())
        if not self._prompt_sent and meta.get("input_token_logprobs"):
            self._prompt_sent = True
            events.append(PromptTokens(self._prompt_records(meta)))
        new_ids, text = cumulative.update(ids, text, final=reason is not None)
        records = self._records(meta, start, new_ids)
        finish = None if reason is None else self._finish(index, reason, ids)
        stop = finish.stop if finish is not None else None
        if stop and stop.stop_token_id is not None and records and not self._request.stopping.include_stop_in_output:
            records.pop()
        if records or text:
            events.append(TokenDelta(index, records, text))
        if finish is not None:
            self._done.add(index)
            events.append(self.usage())
            events.append(finish)
        return events

    def _watched_stop(self, ids: Sequence[int], start: int) -> int | None:
        """Where a caller's stop token first appears among the new ids (past ``min_tokens``)."""
        if not self._watched:
            return None
        first = max(start, self._request.stopping.min_tokens)
        return next((i for i in range(first, len(ids)) if ids[i] in self._watched), None)

    def usage(self) -> UsageReport:
        """Cumulative counts over every output; cache hits are those every output's prompt had.

        SGLang counts reasoning tokens only for a request that sets ``require_reasoning`` (its chat
        layer's decision, from the chat template) or a model that opens its think block itself,
        and reports 0 otherwise: a 0 is therefore unknown (absent), not none.
        """
        cached = [c for c in self._cached if c is not None]
        reasoning = sum(self._reasoning) if self._reasoning is not None else 0
        return UsageReport(
            prompt_tokens=self._prompt_tokens or 0,
            completion_tokens=sum(self._completion),
            cached_prompt_tokens=min(cached) if cached else None,
            reasoning_tokens=reasoning or None,
        )

    def _count(self, index: int, meta: Mapping[str, Any], generated: int, cut: bool) -> None:
        prompt = meta.get("prompt_tokens")
        if prompt is not None:
            self._prompt_tokens = prompt
        self._completion[index] = generated if cut else meta.get("completion_tokens", generated)
        cached = meta.get("cached_tokens")
        if cached is not None:
            self._cached[index] = cached
        if self._reasoning is not None:
            self._reasoning[index] = meta.get("reasoning_tokens") or 0

    def _records(self, meta: Mapping[str, Any], start: int, new_ids: Sequence[int]) -> list[TokenRecord]:
        wanted = self._request.output_logprobs
        entries: Sequence[Entry] = meta.get("output_token_logprobs") or ()
        if wanted is None or len(entries) < start + len(new_ids):
            return [TokenRecord(token_id) for token_id in new_ids]
        tops = meta.get("output_top_logprobs")
        by_ids = meta.get("output_token_ids_logprobs")
        return [
            token_record(entries[i], _at(tops, i), _at(by_ids, i), wanted.candidates)
            for i in range(start, start + len(new_ids))
        ]

    def _prompt_records(self, meta: Mapping[str, Any]) -> list[TokenRecord]:
        """Prompt tokens from ``prompt_logprob_start`` on (SGLang may start one token earlier)."""
        request = self._request
        assert request.prompt_logprobs is not None
        selection = request.prompt_logprobs.candidates
        start = request.prompt_logprob_start
        first = prompt_logprob_row(start)
        tops, by_ids = meta.get("input_top_logprobs"), meta.get("input_token_ids_logprobs")
        ids = self._prompt_ids
        records = []
        for row, entry in enumerate(meta["input_token_logprobs"]):
            position = first + row
            if position < start:
                continue
            if ids is not None and position < len(ids) and entry[1] != ids[position]:
                # SGLang reports ids from the vocabulary's last on as 0 (its guard for image pads).
                entry = (entry[0], ids[position], self._decode([ids[position]]))
            if entry[0] is None:
                records.append(TokenRecord(entry[1], entry[2] or ""))
            else:
                records.append(token_record(entry, _at(tops, row), _at(by_ids, row), selection))
        return records

    def _finish(self, index: int, reason: Mapping[str, Any], ids: Sequence[int]) -> OutputFinished:
        kind = reason.get("type")
        if kind == "length":
            return OutputFinished(index, pb.FINISH_REASON_LENGTH)
        if kind == "stop":
            return OutputFinished(index, pb.FINISH_REASON_STOP, self._stop_match(reason.get("matched"), ids))
        if kind == "abort":
            message = str(reason.get("message") or "aborted by SGLang")
            status = reason.get("status_code")
            if status is None:
                return OutputFinished(index, pb.FINISH_REASON_CANCELLED, message=message)
            raise abort_failure(int(status), message, decode=self._request.kv_session is not None)
        raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"SGLang finished output {index} with {reason!r}")

    def _stop_match(self, matched: Any, ids: Sequence[int]) -> StopMatch:
        """A matched stop string, else the matched token: the caller's stop token, or EOS.

        SGLang reports EOS and a caller's stop token alike (``FINISH_MATCHED_TOKEN``); a grammar
        that terminates reports its last token, which is the model's EOS.
        """
        stopping = self._request.stopping
        if isinstance(matched, str):
            if matched in stopping.stop_texts:
                return StopMatch.text(matched)
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"SGLang stopped the output on {matched!r}")
        if isinstance(matched, list):
            matched = matched[-1] if matched else None
        token_id = matched if isinstance(matched, int) else (ids[-1] if ids else None)
        if token_id is None:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, "SGLang reported a stop without the token that matched")
        return stop_match_for_token(token_id, stopping, self._eos) or StopMatch.eos(token_id)


def token_record(
    entry: Entry, top: Sequence[Entry] | None, by_id: Sequence[Entry] | None, selection: CandidateSelection | None
) -> TokenRecord:
    """One token with its logprob, its rank when the top list holds it, and the selected candidates.

    Top-N candidates come ranked from SGLang's top list (sorted by logprob); explicit ids come
    in request order without a rank (SGLang does not rank them in the vocabulary).
    """
    logprob, token_id, text = entry[0], entry[1], entry[2]
    top = top or ()
    rank = next((position for position, c in enumerate(top, start=1) if c[1] == token_id), None)
    candidates: Sequence[Candidate] = ()
    if selection is not None and selection.mode == _IDS:
        found = {c[1]: c for c in by_id or ()}
        candidates = [Candidate(i, found[i][0], found[i][2] or "") for i in selection.token_ids if i in found]
    elif selection is not None:
        shown = top if selection.mode == _ALL else top[: selection.top_n]
        candidates = [Candidate(c[1], c[0], c[2] or "", position) for position, c in enumerate(shown, start=1)]
    return TokenRecord(token_id, text or "", logprob, rank, candidates)


def _at(rows: Sequence[Any] | None, index: int) -> Any:
    return rows[index] if rows is not None and index < len(rows) else None


def abort_failure(status: int, message: str, *, decode: bool) -> EngineFailure:
    """An SGLang abort that carries an HTTP status: the request failed, it was not cancelled."""
    if status == 400:
        return EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, f"SGLang rejected the request: {message}")
    if status in (429, 503):
        return EngineFailure(pb.ERROR_CODE_OVERLOADED, f"SGLang is full: {message}", retryable=True, retry_after_ms=100)
    if decode and status >= 500:
        return EngineFailure(
            pb.ERROR_CODE_KV_TRANSFER_FAILED,
            f"SGLang's KV transfer failed: {message}",
            retryable=True,
            retry_after_ms=0,
        )
    return EngineFailure(pb.ERROR_CODE_INTERNAL, f"SGLang failed the request ({status}): {message}")


__all__ = ["Entry", "RequestStream", "abort_failure", "token_record"]
