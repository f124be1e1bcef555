"""Sampling over the pseudo-model's distributions, with every knob acting for real.

Order of operations follows vLLM: penalties on the raw logits (repetition over prompt and
output, frequency and presence over the output), then the guided-decoding mask and the
``min_tokens`` ban, then temperature (0 = greedy), min_p, top_k (0 = no limit), top_p, and
one draw. Each token consumes exactly one uniform draw from the output's own generator, so a
request ``seed`` reproduces its outputs exactly; greedy tokens draw nothing. The common cases
(greedy, plain sampling at temperature 1) read the precomputed row tables and cost O(1) /
O(log V).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from openengine_gateway.spi import Sampling

from .model import PseudoModel
from .tokenizer import VOCAB_SIZE


class Uniform(Protocol):
    """A source of uniform draws in [0, 1): a numpy ``Generator`` or an ``OutputRng``."""

    def random(self) -> float:
        """The next draw."""
        ...


class OutputRng:
    """An output's generator, seeded at once but built on its first draw.

    Building a numpy ``Generator`` costs several microseconds, and greedy outputs never draw.
    """

    __slots__ = ("_entropy", "_generator")

    def __init__(self, entropy: int | list[int]) -> None:
        self._entropy = entropy
        self._generator: np.random.Generator | None = None

    def random(self) -> float:
        """The next draw of ``np.random.default_rng(entropy)``."""
        if self._generator is None:
            self._generator = np.random.default_rng(self._entropy)
        return self._generator.random()


class Sampler:
    """One output's sampling state: its generator and the counts its penalties need."""

    __slots__ = (
        "_counts",
        "_frequency",
        "_greedy",
        "_min_p",
        "_model",
        "_plain",
        "_presence",
        "_repetition",
        "_rng",
        "_seen",
        "_temperature",
        "_top_k",
        "_top_p",
    )

    def __init__(self, model: PseudoModel, sampling: Sampling, rng: Uniform, prompt: Sequence[int]) -> None:
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
        unpenalized = self._counts is None and self._seen is None
        self._greedy = unpenalized and self._temperature == 0.0
        """Unconstrained tokens are the row's best."""
        self._plain = (
            unpenalized and self._temperature == 1.0 and self._top_k == 0 and self._top_p >= 1.0 and self._min_p == 0.0
        )
        """Unconstrained tokens are drawn from the row's precomputed distribution."""

    def observe(self, token_id: int) -> None:
        """Record a generated token for the penalties."""
        if self._counts is not None:
            self._counts[token_id] += 1
        if self._seen is not None:
            self._seen[token_id] = True

    def sample(self, row: int, banned: Sequence[int] = (), allowed: np.ndarray | None = None) -> int:
        """Draw the next token from ``row``; ``banned`` ids and ids outside ``allowed`` are excluded.

        When the ban would exclude every allowed token (a finished guided output still under
        ``min_tokens``), the guidance wins and the ban is dropped.
        """
        tables = self._model.tables
        if not banned and allowed is None:
            if self._greedy:
                return tables.best[row]
            if self._plain:
                return self._model.draw(row, self._rng.random())
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


def output_rng(seed: int | None, index: int, fallback: np.random.Generator) -> OutputRng:
    """Output ``index``'s generator: derived from the request seed, else from the engine's.

    The fallback is drawn from now, so unseeded outputs take its values in arrival order.
    """
    if seed is None:
        return OutputRng(int(fallback.integers(1 << 63)))
    return OutputRng([seed, index])


__all__ = ["OutputRng", "Sampler", "Uniform", "output_rng"]
