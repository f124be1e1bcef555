"""Helpers for the chores every driver's output path has.

* ``CumulativeOutput``: engines that stream cumulative ids and text (SGLang, TensorRT-LLM)
  become deltas.
* ``StopTextMatcher``: hold back a partial stop-string match while streaming, cut at the
  match, keep or drop the stop text as the caller asked.
* ``stop_match_for_token``: tell a caller's stop token from the model's EOS.
* ``select_candidates``: turn an engine's per-position logprobs (a mapping, or the whole
  vocabulary's row as an array) into the caller's candidate selection (top N, explicit ids, or
  all), with ranks.
* ``resolve_max_tokens``: the concrete output budget when the caller gave none.

All are pure and allocation-light; none imports an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import pb
from ..errors import EngineFailure, InvalidArgument
from .events import Candidate, StopMatch
from .requests import CandidateSelection, GenerationRequest, Stopping


class CumulativeOutput:
    """Turns one output's cumulative token ids and text into deltas.

    ``update(ids, text)`` takes the engine's full output so far and returns what is new.
    Token ids are compared by count; text by length, so an engine that revises its last
    (incomplete UTF-8) characters is handled by only ever emitting a stable prefix: text is
    emitted up to the last character that is not U+FFFD.
    """

    __slots__ = ("_text_sent", "_tokens_sent")

    def __init__(self) -> None:
        self._tokens_sent = 0
        self._text_sent = 0

    @property
    def tokens_sent(self) -> int:
        """How many token ids have been returned so far."""
        return self._tokens_sent

    def update(self, token_ids: Sequence[int], text: str, *, final: bool = False) -> tuple[Sequence[int], str]:
        """The new token ids and the new, stable text since the previous call."""
        new_ids = token_ids[self._tokens_sent :]
        self._tokens_sent = len(token_ids)
        stable = len(text) if final else _stable_length(text)
        new_text = text[self._text_sent : stable] if stable > self._text_sent else ""
        self._text_sent = max(self._text_sent, stable)
        return new_ids, new_text


def _stable_length(text: str) -> int:
    """Length of ``text`` without a trailing run of replacement characters (partial UTF-8)."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    return end


@dataclass(frozen=True, slots=True)
class StopTextHit:
    """A stop string matched: ``text`` is what to emit before ending the output."""

    text: str
    stop: str


class StopTextMatcher:
    """Streams text while holding back any suffix that could still become a stop string.

    ``feed(new_text)`` returns either the text that is safe to emit now (a ``str``), or a
    ``StopTextHit`` when a stop string completed: its ``text`` is the remaining output up to
    the match, plus the stop string itself when ``include_stop`` is set. ``flush()`` returns
    the held-back text when the output ends for another reason.

    Text fed with ``armed=False`` (of the first ``min_tokens`` tokens) cannot end the output, but what
    could begin a stop string is held back as always: a stop string that this text begins and
    later, armed text completes still ends it, as in vLLM, where stop strings are checked from
    ``min_tokens`` on over the text generated before too.
    """

    __slots__ = ("_buffer", "_include", "_longest", "_stops", "_unarmed")

    def __init__(self, stops: Sequence[str], *, include_stop: bool) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._include = include_stop
        self._buffer = ""
        self._unarmed = 0
        """How many leading characters of the buffer were fed unarmed: no match may end among them."""

    def feed(self, new_text: str, *, armed: bool = True) -> str | StopTextHit:
        """Add generated text; return emit-able text, or the hit that ends the output."""
        if not self._stops:
            return new_text
        buffer = self._buffer + new_text
        if armed:
            # The stop string that completes first wins (on a tie, the longer one), as if the
            # text had arrived one character at a time: the result never depends on chunking.
            hit_end, hit = -1, ""
            for stop in self._stops:
                at = buffer.find(stop, max(0, self._unarmed - len(stop) + 1))
                if at == -1:
                    continue
                end = at + len(stop)
                if hit_end == -1 or end < hit_end or (end == hit_end and len(stop) > len(hit)):
                    hit_end, hit = end, stop
            if hit_end != -1:
                self._buffer, self._unarmed = "", 0
                return StopTextHit(buffer[: hit_end if self._include else hit_end - len(hit)], hit)
        keep = self._held_suffix(buffer)
        released = len(buffer) - keep
        self._buffer = buffer[released:]
        self._unarmed = keep if not armed else max(0, self._unarmed - released)
        return buffer[:released]

    def flush(self) -> str:
        """Release held-back text (the output ended without completing a stop string)."""
        text, self._buffer, self._unarmed = self._buffer, "", 0
        return text

    def _held_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop string."""
        for length in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0


def stop_match_for_token(token_id: int, stopping: Stopping, eos_token_ids: Sequence[int]) -> StopMatch | None:
    """Why ``token_id`` ended an output: a caller stop token first, else the model's EOS.

    A token that is both (a caller listed the EOS id) is reported as the caller's stop token:
    the caller asked for it by name. Returns None when it is neither.
    """
    if token_id in stopping.stop_token_ids:
        return StopMatch.token(token_id)
    if token_id in eos_token_ids and not stopping.ignore_eos:
        return StopMatch.eos(token_id)
    return None


LogprobRow = Sequence[float] | npt.NDArray[np.floating[Any]]
"""One position's logprobs over the whole vocabulary, indexed by token id (a numpy array, or a list)."""


def select_candidates(
    selection: CandidateSelection | None,
    logprobs: Mapping[int, float] | LogprobRow,
    *,
    decode: Callable[[int], str] = lambda _: "",
    ranks: Mapping[int, int] | None = None,
) -> list[Candidate]:
    """The caller's candidates at one position from the engine's logprobs.

    ``logprobs`` is either the whole vocabulary's row (``LogprobRow``: ranks are then vocabulary
    ranks, computed from it) or a ``token_id -> logprob`` mapping, which must cover what the
    selection needs (the engine was asked for enough). A requested id it lacks raises an
    INTERNAL ``EngineFailure``, never a made-up value. A mapping's ranks come from ``ranks``
    when the engine reports them, else from the order of its values (1 = most likely: vocabulary
    ranks only when it holds the row's most likely entries). TOP_N returns the best ``top_n`` in
    rank order; TOKEN_IDS returns the requested ids in request order; ALL returns every entry in
    rank order.
    """
    if selection is None:
        return []
    if not isinstance(logprobs, Mapping):
        return _select_from_row(selection, np.asarray(logprobs, dtype=np.float64), decode)
    if ranks is None:
        ranks = rank_by_logprob(logprobs)
    mode = selection.mode
    if mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        ids: Sequence[int] = selection.token_ids
        _require_scored([i for i in ids if i not in logprobs])
    else:
        ids = sorted(logprobs, key=ranks.__getitem__)
        if mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N:
            ids = ids[: selection.top_n]
    return [Candidate(i, logprobs[i], decode(i), ranks.get(i)) for i in ids]


def _select_from_row(
    selection: CandidateSelection, row: npt.NDArray[np.float64], decode: Callable[[int], str]
) -> list[Candidate]:
    """Candidates from a whole-vocabulary row, with vocabulary ranks (ties: the lower id first)."""
    mode = selection.mode
    if mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        _require_scored([i for i in selection.token_ids if i >= len(row)])
        ids = np.asarray(selection.token_ids, dtype=np.int64)
        values = row[ids]
        better = (row[None, :] > values[:, None]).sum(axis=1)
        tied_below = np.array([(row[:i] == row[i]).sum() for i in selection.token_ids], dtype=np.int64)
        ranks = 1 + better + tied_below
    else:
        if mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N and selection.top_n < len(row):
            ids = _best(row, selection.top_n)
        else:
            ids = np.argsort(-row, kind="stable")
        ranks = np.arange(1, len(ids) + 1)
    return [
        Candidate(token_id, value, decode(token_id), rank)
        for token_id, value, rank in zip(ids.tolist(), row[ids].tolist(), ranks.tolist(), strict=True)
    ]


def _best(row: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.intp]:
    """The ``n`` most likely ids in rank order, in time linear in the vocabulary."""
    if n <= 0:
        return np.empty(0, dtype=np.intp)
    threshold = -np.partition(-row, n - 1)[n - 1]
    above = np.flatnonzero(row > threshold)
    ids = np.concatenate([above, np.flatnonzero(row == threshold)[: n - len(above)]])
    ranked: npt.NDArray[np.intp] = ids[np.lexsort((ids, -row[ids]))]
    return ranked


def _require_scored(missing: Sequence[int]) -> None:
    if missing:
        raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"the engine reported no logprob for candidate ids {list(missing)}")


def rank_by_logprob(logprobs: Mapping[int, float]) -> dict[int, int]:
    """1-based ranks by descending logprob; ties keep the lower token id first."""
    order = sorted(logprobs.items(), key=lambda item: (-item[1], item[0]))
    return {token_id: rank for rank, (token_id, _) in enumerate(order, start=1)}


def resolve_max_tokens(
    request: GenerationRequest, prompt_tokens: int, max_context: int | None, max_output: int | None = None
) -> int:
    """The output budget: the caller's ``max_tokens``, else what fits in the context.

    Raises ``InvalidArgument`` when the prompt alone fills the context, the caller's budget
    does not fit (the context, or ``max_output``), or ``min_tokens`` cannot be honoured within
    the budget; an engine's own small default is never used.
    """
    if max_context is not None and prompt_tokens >= max_context:
        raise InvalidArgument(f"prompt has {prompt_tokens} tokens; the model's context is {max_context}")
    room = None if max_context is None else max_context - prompt_tokens
    wanted = request.stopping.max_tokens
    if wanted is None:
        budgets = [b for b in (room, max_output) if b is not None]
        if not budgets:
            raise InvalidArgument("stopping.max_tokens is required: the model reports no context length")
        budget = min(budgets)
    else:
        if room is not None and wanted > room:
            raise InvalidArgument(
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({wanted}) exceeds the context ({max_context})"
            )
        if max_output is not None and wanted > max_output:
            raise InvalidArgument(f"stopping.max_tokens ({wanted}) exceeds the model's {max_output} output tokens")
        budget = wanted
    wanted_min = request.stopping.min_tokens
    if wanted_min > budget:
        raise InvalidArgument(f"stopping.min_tokens ({wanted_min}) exceeds the {budget} tokens left for output")
    return budget


__all__ = [
    "CumulativeOutput",
    "LogprobRow",
    "StopTextHit",
    "StopTextMatcher",
    "rank_by_logprob",
    "resolve_max_tokens",
    "select_candidates",
    "stop_match_for_token",
]
