"""Guided decoding that really constrains sampling: a per-step mask of allowed tokens.

Tokens are bytes, so a guide tracks the bytes emitted so far and allows exactly the next
bytes that keep the output a viable prefix of some match; EOS is allowed exactly when the
output is a complete match. ``ChoiceGuide`` is exact (a trie walk over the choices' UTF-8).
``RegexGuide`` tests candidate characters with the ``regex`` module's partial matching; its
candidates are every ASCII character plus the non-ASCII characters the pattern names
literally, so its outputs always match, but a pattern that can only continue with some other
non-ASCII character reaches a dead end (``allowed`` all false), which the engine reports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import regex
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Guidance

from .tokenizer import BYTE_TOKENS, EOS, VOCAB_SIZE


class Guide(ABC):
    """The constraint state of one output."""

    @abstractmethod
    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens that may come next."""

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

    def _viable(self, text: str) -> bool:
        return self._pattern.fullmatch(text, partial=True) is not None

    def allowed(self) -> np.ndarray:
        mask = np.zeros(VOCAB_SIZE, dtype=bool)
        text, pending = self._text, self._pending
        if not pending:
            for byte in range(0x80):
                mask[byte] = self._viable(text + chr(byte))
            mask[EOS] = self._pattern.fullmatch(text) is not None
        for encoded in self._extra:
            if len(encoded) > len(pending) and encoded.startswith(pending) and not mask[encoded[len(pending)]]:
                mask[encoded[len(pending)]] = self._viable(text + encoded.decode("utf-8"))
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
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        guide: Guide = ChoiceGuide(guidance.choices)
    elif guidance.mode == pb.GUIDED_DECODING_MODE_REGEX:
        try:
            guide = RegexGuide(regex.compile(guidance.spec))
        except regex.error as exc:
            raise InvalidArgument(f"guided.regex does not compile: {exc}") from None
    else:
        raise InvalidArgument(f"guided mode {pb.GuidedDecodingMode.Name(guidance.mode)} is not implemented")
    if not guide.allowed().any():
        raise InvalidArgument("the guided constraint cannot be satisfied with this engine's output alphabet")
    return guide


__all__ = ["ChoiceGuide", "Guide", "RegexGuide", "make_guide"]
