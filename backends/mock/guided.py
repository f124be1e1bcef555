"""Guided decoding that really constrains sampling: a per-step mask of allowed tokens.

Tokens are bytes, so a guide tracks the bytes emitted so far and allows exactly the next
bytes that keep the output a viable prefix of some match; EOS is allowed exactly when the
output is a complete match. ``ChoiceGuide`` is exact (a trie walk over the choices' UTF-8).
``RegexGuide`` tests candidate characters with the ``regex`` module's partial matching; its
candidates are every ASCII character plus the non-ASCII characters the pattern names
literally, so its outputs always match, but a pattern that can only continue with some other
non-ASCII character reaches a dead end (``allowed`` all false), which the engine reports.
Partial matching backtracks, exponentially for some patterns (``(a|aa)*c``), and the engine's
loop waits on every mask, so one mask has a time budget: a pattern that exceeds it fails its
request as INVALID_ARGUMENT (before acceptance when the first mask does). The budget is checked
between matches and by ``regex``'s own timeout, which a pattern's first match ignores (for a
long literal it costs the cube of the literal's length), so patterns are also limited in length.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np
import regex
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument
from openengine_gateway.spi import Guidance

from .tokenizer import BYTE_TOKENS, EOS, VOCAB_SIZE

GUIDE_BACKEND = "mock"
"""The name of the one guided-decoding backend (these guides): ``guided.backend`` may name only it."""
MASK_BUDGET_S = 0.1
"""The most one regex mask may take (normally well under a millisecond)."""
MAX_PATTERN_CHARS = 512
"""The longest regex taken: the first match of a literal this long takes about 20 ms, uninterrupted."""


class Guide(ABC):
    """The constraint state of one output."""

    @abstractmethod
    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens that may come next.

        Raises an INVALID_ARGUMENT ``EngineFailure`` when the guide cannot compute it in time."""

    @abstractmethod
    def advance(self, token_id: int) -> None:
        """Record the token that was sampled (it was allowed)."""


class ChoiceGuide(Guide):
    """The output must be exactly one of the choices."""

    __slots__ = ("_choices", "_emitted")

    def __init__(self, choices: tuple[str, ...]) -> None:
        self._choices = [choice.encode("utf-8") for choice in choices]
        self._emitted = b""

    def allowed(self) -> np.ndarray:
        mask = np.zeros(VOCAB_SIZE, dtype=bool)
        done = len(self._emitted)
        for choice in self._choices:
            if choice.startswith(self._emitted):
                mask[choice[done] if len(choice) > done else EOS] = True
        return mask

    def advance(self, token_id: int) -> None:
        if token_id < BYTE_TOKENS:
            self._emitted += bytes((token_id,))


class RegexGuide(Guide):
    """The output must fully match a regular expression."""

    __slots__ = ("_extra", "_pattern", "_pending", "_text")

    def __init__(self, pattern: regex.Pattern[str]) -> None:
        self._pattern = pattern
        self._extra = sorted({c.encode("utf-8") for c in pattern.pattern if ord(c) >= 0x80})
        self._text = ""
        self._pending = b""

    def _matches(self, text: str, deadline: float, *, partial: bool = True) -> bool:
        """Whether ``text`` matches (or, ``partial``, can still match) within the mask's budget."""
        try:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError
            return self._pattern.fullmatch(text, partial=partial, timeout=remaining) is not None
        except TimeoutError:
            raise EngineFailure(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"guided.regex is too costly to match: one token's mask took over {MASK_BUDGET_S * 1000:.0f} ms",
            ) from None

    def allowed(self) -> np.ndarray:
        deadline = time.perf_counter() + MASK_BUDGET_S
        mask = np.zeros(VOCAB_SIZE, dtype=bool)
        text, pending = self._text, self._pending
        if not pending:
            for byte in range(0x80):
                mask[byte] = self._matches(text + chr(byte), deadline)
            mask[EOS] = self._matches(text, deadline, partial=False)
        for encoded in self._extra:
            if len(encoded) > len(pending) and encoded.startswith(pending) and not mask[encoded[len(pending)]]:
                mask[encoded[len(pending)]] = self._matches(text + encoded.decode("utf-8"), deadline)
        return mask

    def advance(self, token_id: int) -> None:
        if token_id >= BYTE_TOKENS:
            return
        self._pending += bytes((token_id,))
        try:
            character = self._pending.decode("utf-8")
        except UnicodeDecodeError:
            return  # an unfinished character: only its continuations are allowed next
        self._text += character
        self._pending = b""


def make_guide(guidance: Guidance) -> Guide:
    """A fresh guide for one output; raises ``InvalidArgument`` for a bad or unsatisfiable spec."""
    guidance.require_backend(GUIDE_BACKEND, engine="mock", setting="guided-decoding backend")
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        guide: Guide = ChoiceGuide(guidance.choices)
    elif guidance.mode == pb.GUIDED_DECODING_MODE_REGEX:
        if len(guidance.spec) > MAX_PATTERN_CHARS:
            raise InvalidArgument(f"guided.regex is longer than this engine's {MAX_PATTERN_CHARS} characters")
        try:
            guide = RegexGuide(regex.compile(guidance.spec))
        except regex.error as exc:
            raise InvalidArgument(f"guided.regex does not compile: {exc}") from None
    else:
        raise InvalidArgument(f"guided mode {pb.GuidedDecodingMode.Name(guidance.mode)} is not implemented")
    try:
        satisfiable = guide.allowed().any()
    except EngineFailure as failure:
        raise InvalidArgument(failure.message) from None
    if not satisfiable:
        raise InvalidArgument("the guided constraint cannot be satisfied with this engine's output alphabet")
    return guide


__all__ = ["GUIDE_BACKEND", "ChoiceGuide", "Guide", "RegexGuide", "make_guide"]
