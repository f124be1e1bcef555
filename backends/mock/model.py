"""The seeded pseudo-model: a real next-token distribution for every context.

The "model" is a table of logit rows drawn once from the seed. A context picks its row by
hashing its last ``CONTEXT_WINDOW`` tokens together with the LoRA adapter id, so the same
context always gives the same distribution, a different adapter gives a different one, and
nothing is a fixed answer. Rows come in two families: free rows that favour printable text
(with an occasional multi-byte lead byte), and continuation rows that favour UTF-8
continuation bytes, chosen while a character is unfinished, so generated text is mostly
valid UTF-8 and multi-byte characters do occur.

Per row the log-softmax, the descending order, the 1-based ranks and the cumulative
probabilities in that order are precomputed, so greedy decoding, plain sampling, logprobs,
ranks and top-N candidates cost O(1) or O(log V) per token. EOS gets a per-row probability
(mostly small, large in a few rows) so outputs end on their own, greedy ones included.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .tokenizer import BOS, EOS, VOCAB_SIZE

CONTEXT_WINDOW = 4
"""How many trailing tokens select a row."""
FREE_ROWS = 1024
CONTINUATION_ROWS = 256
_MASK64 = (1 << 64) - 1
_FNV_PRIME = 0x100000001B3


@dataclass(frozen=True, slots=True)
class ModelTables:
    """Read-only per-row arrays, shape ``(rows, VOCAB_SIZE)``."""

    logits: np.ndarray
    logprobs: np.ndarray
    order: np.ndarray
    """Token ids by descending probability (ties: lower id first)."""
    ranks: np.ndarray
    """1-based rank of each token id in its row."""
    cdf: np.ndarray
    """Cumulative probability along ``order``."""
    best: tuple[int, ...]
    """Each row's most likely token id (``order[:, 0]``), for greedy decoding without numpy."""


def _free_base() -> np.ndarray:
    base = np.full(VOCAB_SIZE, -7.0)
    base[0x20:0x7F] = 0.0
    base[ord("a") : ord("z") + 1] = 1.0
    base[ord(" ")] = 1.5
    base[ord("\n")] = -1.0
    base[0x80:0xC0] = -9.0  # a continuation byte cannot start a character
    base[0xC0:0x100] = -10.0
    base[0xC2:0xE0] = -3.5  # two-byte characters
    base[0xE1:0xED] = -4.5  # three-byte characters whose continuations are all valid
    base[BOS] = -12.0
    return base


def _continuation_base() -> np.ndarray:
    base = np.full(VOCAB_SIZE, -8.0)
    base[0x80:0xC0] = 0.0
    base[BOS] = -12.0
    return base


def _with_eos(logits: np.ndarray, eos_probability: np.ndarray) -> None:
    """Set the EOS logit of each row so that EOS has exactly the given probability."""
    others = logits.copy()
    others[:, EOS] = -np.inf
    top = others.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(others - top).sum(axis=1, keepdims=True)))[:, 0]
    logits[:, EOS] = lse + np.log(eos_probability / (1.0 - eos_probability))


@functools.lru_cache(maxsize=8)
def build_tables(seed: int) -> ModelTables:
    """The tables for ``seed`` (cached: every engine with the same seed shares them)."""
    rng = np.random.default_rng([seed, 0x6D6F636B])
    free = _free_base() + rng.normal(0.0, 1.2, (FREE_ROWS, VOCAB_SIZE))
    cont = _continuation_base() + rng.normal(0.0, 1.2, (CONTINUATION_ROWS, VOCAB_SIZE))
    kind = rng.random(FREE_ROWS)
    _with_eos(free, np.where(kind < 0.03, 0.5, np.where(kind < 0.15, 0.05, 0.004)))
    _with_eos(cont, np.full(CONTINUATION_ROWS, 0.001))
    logits = np.concatenate([free, cont])
    top = logits.max(axis=1, keepdims=True)
    logprobs = logits - (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))
    order = np.argsort(-logprobs, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, VOCAB_SIZE + 1)[None, :].repeat(len(order), 0), axis=1)
    cdf = np.cumsum(np.exp(np.take_along_axis(logprobs, order, axis=1)), axis=1)
    for array in (logits, logprobs, order, ranks, cdf):
        array.setflags(write=False)
    return ModelTables(logits, logprobs, order, ranks, cdf, tuple(order[:, 0].tolist()))


def _needs_continuation(tokens: Sequence[int]) -> bool:
    """Whether the trailing bytes are an unfinished UTF-8 character."""
    if not tokens:
        return False
    last = tokens[-1]
    if not 0x80 <= last <= 0xBF:  # the common case: only a lead byte can end unfinished
        return 0xC2 <= last <= 0xF4
    trailing = 0
    position = len(tokens) - 1
    while position >= 0 and trailing < 4 and 0x80 <= tokens[position] <= 0xBF:
        trailing += 1
        position -= 1
    if position < 0:
        return False
    lead = tokens[position]
    needed = 1 if 0xC2 <= lead <= 0xDF else 2 if 0xE0 <= lead <= 0xEF else 3 if 0xF0 <= lead <= 0xF4 else 0
    return trailing < needed


def _mix(value: int) -> int:
    """splitmix64 finalizer: spreads a 64-bit value over all bits."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK64
    return value ^ (value >> 31)


ADAPTER_TABLES = 16
"""Per-adapter tables kept at most: ``forget`` drops an unloaded adapter's, but a request still
running with it when it was unloaded builds it again, and adapter ids are the caller's."""


def bound(tables: dict[int, Any]) -> None:
    """Drop the oldest of ``tables`` past ``ADAPTER_TABLES`` (rebuilt on demand if used again)."""
    while len(tables) > ADAPTER_TABLES:
        del tables[next(iter(tables))]


def _root_key(seed: int, lora_id: int) -> int:
    """The hash every context of a (seed, adapter) starts from."""
    return _mix((seed * 0x9E3779B97F4A7C15 + lora_id) & _MASK64)


class PseudoModel:
    """Next-token distributions by context; ``lora_id`` 0 is the base model."""

    __slots__ = ("_first_steps", "_inverse_cdfs", "seed", "tables")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.tables = build_tables(seed)
        self._first_steps: dict[int, list[int]] = {}
        """Per adapter, the hash after each possible first window token (saves two big-int ops a token)."""
        self._inverse_cdfs: dict[int, tuple[list[float], list[int]]] = {}
        """Per row drawn from, its ``cdf`` and ``order`` as Python lists, for ``draw`` (~10 KB a row,
        ~13 MB if every row is drawn from)."""

    def row(self, context: Sequence[int], lora_id: int = 0) -> int:
        """The row holding the distribution of the token that follows ``context``."""
        # FNV-1a over the window, masked once: the low 64 bits of a xor or a product depend only
        # on the low 64 bits of the operands, so this is what masking every step gives.
        window = context[-CONTEXT_WINDOW:]
        if len(window) == CONTEXT_WINDOW:  # always but for a prompt shorter than the window
            first, second, third, last = window
            steps = self._first_steps.get(lora_id) or self._first_step_table(lora_id)
            key = (((steps[first] ^ second) * _FNV_PRIME ^ third) * _FNV_PRIME ^ last) * _FNV_PRIME
        else:
            key = _root_key(self.seed, lora_id)
            for token in window:
                key = (key ^ token) * _FNV_PRIME
        key = _mix(key & _MASK64)
        if _needs_continuation(context):
            return FREE_ROWS + key % CONTINUATION_ROWS
        return key % FREE_ROWS

    def forget(self, lora_id: int) -> None:
        """Drop what was precomputed for an unloaded adapter (ids are the caller's, so unbounded)."""
        self._first_steps.pop(lora_id, None)

    def _first_step_table(self, lora_id: int) -> list[int]:
        root = _root_key(self.seed, lora_id)
        steps = [(root ^ token) * _FNV_PRIME & _MASK64 for token in range(VOCAB_SIZE)]
        self._first_steps[lora_id] = steps
        bound(self._first_steps)
        return steps

    def row_at(self, tokens: Sequence[int], end: int, lora_id: int = 0) -> int:
        """The row after ``tokens[:end]``, reading only the few tokens a row depends on."""
        return self.row(tokens[max(0, end - CONTEXT_WINDOW - 1) : end], lora_id)

    def logprob(self, row: int, token_id: int) -> float:
        """log P(token_id) in ``row``."""
        return float(self.tables.logprobs[row, token_id])

    def rank(self, row: int, token_id: int) -> int:
        """1-based rank of ``token_id`` in ``row``."""
        return int(self.tables.ranks[row, token_id])

    def draw(self, row: int, uniform: float) -> int:
        """The token of ``row`` at cumulative probability ``uniform`` (plain sampling's one draw).

        Exactly ``order[searchsorted(cdf, uniform, side="right")]``, but bisecting Python lists
        (built on a row's first draw) costs ~0.1 µs where a scalar ``np.searchsorted`` costs ~1 µs.
        """
        lists = self._inverse_cdfs.get(row)
        if lists is None:
            lists = self._inverse_cdfs[row] = (self.tables.cdf[row].tolist(), self.tables.order[row].tolist())
        cdf, order = lists
        return order[min(bisect.bisect_right(cdf, uniform), VOCAB_SIZE - 1)]

    def top(self, row: int, n: int) -> list[int]:
        """The ``n`` most likely token ids of ``row``, best first."""
        return [int(t) for t in self.tables.order[row, :n]]


__all__ = [
    "ADAPTER_TABLES",
    "CONTEXT_WINDOW",
    "CONTINUATION_ROWS",
    "FREE_ROWS",
    "ModelTables",
    "PseudoModel",
    "bound",
    "build_tables",
]
