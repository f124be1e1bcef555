"""Sampling over the pseudo-model's distributions, with every knob acting for real.

Order of operations follows vLLM: penalties on the raw logits (repetition over prompt and
output, frequency and presence over the output), then the guided-decoding mask and the
``min_tokens`` ban, then temperature (0 = greedy), min_p, top_k (0 = no limit), top_p, and
one draw. Each token consumes exactly one uniform draw from the output's own generator, so a
request ``seed`` reproduces its outputs exactly. The common cases (greedy, plain sampling at
temperature 1) read the precomputed row tables and cost O(1) / O(log V).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from openengine_gateway.spi import Sampling

from .model import PseudoModel
from .tokenizer import VOCAB_SIZE


class Sampler:
    """One output's sampling state: its generator and the counts its penalties need."""

    __slots__ = (
        "_counts",
        "_frequency",
        "_min_p",
        "_model",
        "_presence",
        "_repetition",
        "_rng",
        "_seen",
        "_temperature",
        "_top_k",
        "_top_p",
    )

    def __init__(self, model: PseudoModel, sampling: Sampling, rng: np.random.Generator, prompt: Sequence[int]) -> None:
        self._model = model
        self._rng = rng
        self._temperature = 1.0 if sampling.temperature is None else sampling.temperature
        self._top_p = 1.0 if sampling.top_p is None else sampling.top_p
        self._top_k = sampling.top_k or 0
        self._min_p = sampling.min_p or 0.0
        self._frequency = sampling.frequency_penalty or 0.0
        self._presence = sampling.presence_penalty or 0.0
        self._repetition = 1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
        self._counts = np.zeros(VOCAB_SIZE) if self._frequency or self._presence else None
        self._seen: np.ndarray | None = None
        if self._repetition != 1.0:
            self._seen = np.zeros(VOCAB_SIZE, dtype=bool)
            self._seen[list(prompt)] = True

    def observe(self, token_id: int) -> None:
        """Record a generated token for the penalties."""
        if self._counts is not None:
            self._counts[token_id] += 1
        if self._seen is not None:
            self._seen[token_id] = True

    @property
    def _penalized(self) -> bool:
        return self._counts is not None or self._seen is not None

    def sample(self, row: int, banned: Sequence[int] = (), allowed: np.ndarray | None = None) -> int:
        """Draw the next token from ``row``; ``banned`` ids and ids outside ``allowed`` are excluded.

        When the ban would exclude every allowed token (a finished guided output still under
        ``min_tokens``), the guidance wins and the ban is dropped.
        """
        tables = self._model.tables
        if not banned and allowed is None and not self._penalized:
            if self._temperature == 0.0:
                return int(tables.order[row, 0])
            if self._temperature == 1.0 and self._top_k == 0 and self._top_p >= 1.0 and self._min_p == 0.0:
                index = int(np.searchsorted(tables.cdf[row], self._rng.random(), side="right"))
                return int(tables.order[row, min(index, VOCAB_SIZE - 1)])
        return self._sample_adjusted(tables.logits[row], banned, allowed)

    def _sample_adjusted(self, raw: np.ndarray, banned: Sequence[int], allowed: np.ndarray | None) -> int:
        logits = raw.copy()
        if self._seen is not None:
            touched = logits[self._seen]
            logits[self._seen] = np.where(touched > 0, touched / self._repetition, touched * self._repetition)
        if self._counts is not None:
            logits -= self._frequency * self._counts + self._presence * (self._counts > 0)
        if allowed is not None:
            logits[~allowed] = -np.inf
        if banned:
            restricted = logits.copy()
            restricted[list(banned)] = -np.inf
            if np.isfinite(restricted).any():
                logits = restricted
        if self._temperature == 0.0:
            return int(np.argmax(logits))
        scaled = logits / self._temperature
        order = np.argsort(-scaled, kind="stable")
        probs = np.exp(scaled[order] - scaled[order[0]])
        if self._min_p > 0.0:
            probs[probs < self._min_p] = 0.0  # probabilities are relative to the best (1.0) here
        if 0 < self._top_k < VOCAB_SIZE:
            probs[self._top_k :] = 0.0
        if self._top_p < 1.0:
            cumulative = np.cumsum(probs)
            keep = int(np.searchsorted(cumulative, self._top_p * cumulative[-1])) + 1
            probs[keep:] = 0.0
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return int(order[min(index, VOCAB_SIZE - 1)])


def output_rng(seed: int | None, index: int, fallback: np.random.Generator) -> np.random.Generator:
    """Output ``index``'s generator: derived from the request seed, else from the engine's."""
    if seed is None:
        return np.random.default_rng(int(fallback.integers(1 << 63)))
    return np.random.default_rng([seed, index])


__all__ = ["Sampler", "output_rng"]
