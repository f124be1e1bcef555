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

A pattern's cost is also bounded before any match runs (``check_cost``), as a driver should bound
a grammar's before compiling it: nested unbounded repetition (``((a|aa)*)*``, the classic
catastrophic backtracking) is refused, and so is a pattern whose counted repetitions unroll past
``MAX_UNROLLED``. The backend builds a regex's guides, whose first mask can still take its whole
budget, off the event loop (``asyncio.to_thread``, a few at a time; ``regex`` releases the GIL
while it matches), so that a costly pattern stalls no other client.
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
"""The most CPU time one regex mask may take (normally well under a millisecond)."""
MAX_PATTERN_CHARS = 512
"""The longest regex taken: the first match of a literal this long takes about 20 ms, uninterrupted."""
MAX_UNROLLED = 4 * MAX_PATTERN_CHARS
"""The most atoms a regex may have with its counted repetitions unrolled (``(ab){3}`` is 6)."""


class Guide(ABC):
    """The constraint state of one output."""

    @abstractmethod
    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens that may come next.

        Raises an INVALID_ARGUMENT ``EngineFailure`` when the guide cannot compute it in time."""

    @abstractmethod
    def advance(self, token_id: int) -> None:
        """Record the token that was sampled (it was allowed)."""

    @abstractmethod
    def fresh(self) -> Guide:
        """A guide of the same constraint at its start, for another output (no check repeated)."""


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

    def fresh(self) -> ChoiceGuide:
        guide = ChoiceGuide(())
        guide._choices = self._choices
        return guide


class RegexGuide(Guide):
    """The output must fully match a regular expression."""

    __slots__ = ("_extra", "_pattern", "_pending", "_text")

    def __init__(self, pattern: regex.Pattern[str]) -> None:
        self._pattern = pattern
        self._extra = sorted({c.encode("utf-8") for c in pattern.pattern if ord(c) >= 0x80})
        self._text = ""
        self._pending = b""

    def _matches(self, text: str, deadline: float, *, partial: bool = True) -> bool:
        """Whether ``text`` matches (or, ``partial``, can still match) within the mask's budget.

        ``deadline`` is in this thread's CPU time (``time.thread_time``): a match timed out on the wall
        clock while the process was kept off the CPU (a busy neighbour; vLLM's CPU engine) is tried
        again, so only a pattern that really costs the budget is refused."""
        while (remaining := deadline - time.thread_time()) > 0:
            try:
                return self._pattern.fullmatch(text, partial=partial, timeout=remaining, concurrent=True) is not None
            except TimeoutError:
                continue  # the wall clock ran out: on the CPU (the budget is spent) or off it (try again)
        raise EngineFailure(
            pb.ERROR_CODE_INVALID_ARGUMENT,
            f"guided.regex is too costly to match: one token's mask took over {MASK_BUDGET_S * 1000:.0f} ms of CPU",
        )

    def allowed(self) -> np.ndarray:
        deadline = time.thread_time() + MASK_BUDGET_S
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

    def fresh(self) -> RegexGuide:
        return RegexGuide(self._pattern)


def check_cost(pattern: str) -> None:
    """Refuse (INVALID_ARGUMENT) a pattern whose matching can backtrack without bound, before it is compiled:
    an unbounded repetition of something that repeats without bound, or more than ``MAX_UNROLLED`` atoms
    once counted repetitions are unrolled. A scan of the pattern's text, conservative where it is unsure."""
    frames: list[list[int]] = [[0, 0, 0, 0]]  # per open group: size, nesting, best alternative's size, nesting
    last = (0, 0)  # the size and nesting of the atom a quantifier would apply to
    index = 0
    while index < len(pattern):
        char = pattern[index]
        frame = frames[-1]
        atom: tuple[int, int] | None = None
        if char == "\\":
            index += 1
            atom = (1, 0)
        elif char == "[":
            index = _class_end(pattern, index)
            atom = (1, 0)
        elif char == "(":
            frames.append([0, 0, 0, 0])
            if pattern.startswith("?", index + 1):  # (?:...), (?P<name>...), (?=...), (?i): the prefix is no atom
                while index + 1 < len(pattern) and pattern[index + 1] not in ":)=!>":
                    index += 1
                index += 1 if index + 1 < len(pattern) and pattern[index + 1] != ")" else 0
        elif char == "|":
            frame[2], frame[3] = max(frame[2], frame[0]), max(frame[3], frame[1])
            frame[0] = frame[1] = 0
        elif char == ")" and len(frames) > 1:
            done = frames.pop()
            atom = (max(done[0], done[2]), max(done[1], done[3]))
        elif char in "*+?{" and last != (0, 0):
            high, index = _quantifier(pattern, index)
            if high is not None or char == "?":
                size, nesting = last[0] * (high or 1), last[1]
            else:
                size, nesting = last[0], last[1] + 1
            if nesting > 1:
                raise InvalidArgument("guided.regex repeats a repetition without bound, which backtracks without bound")
            frame[0] += size - last[0]
            frame[1] = max(frame[1], nesting)
            last = (0, 0)
        else:
            atom = (1, 0)
        if atom is not None:
            frame = frames[-1]
            frame[0] += atom[0]
            frame[1] = max(frame[1], atom[1])
            last = atom
        if frames[0][0] > MAX_UNROLLED or frame[0] > MAX_UNROLLED:
            raise InvalidArgument(f"guided.regex unrolls to over {MAX_UNROLLED} atoms (its counted repetitions)")
        index += 1


def _class_end(pattern: str, start: int) -> int:
    """The index of the ``]`` that ends the character class opened at ``start``."""
    index = start + 1
    if pattern.startswith("^", index):
        index += 1
    if pattern.startswith("]", index):
        index += 1
    while index < len(pattern) and pattern[index] != "]":
        index += 2 if pattern[index] == "\\" else 1
    return index


def _quantifier(pattern: str, index: int) -> tuple[int | None, int]:
    """The upper bound of the quantifier at ``index`` (None: unbounded) and its last index (a lazy ``?``
    or possessive ``+`` included); a brace that is no quantifier repeats once, as ``regex`` reads it."""
    char = pattern[index]
    high: int | None = 1 if char == "?" else None
    if char == "{":
        end = pattern.find("}", index)
        parts = pattern[index + 1 : end].split(",") if end > 0 else []
        if not 1 <= len(parts) <= 2 or not all(part.strip().isdigit() or not part.strip() for part in parts):
            return 1, index
        high = int(parts[-1]) if parts[-1].strip() else None
        index = end
    if pattern.startswith(("?", "+"), index + 1):
        index += 1
    return high, index


def make_guide(guidance: Guidance) -> Guide:
    """A fresh guide for one output; raises ``InvalidArgument`` for a bad or unsatisfiable spec."""
    guidance.require_backend(GUIDE_BACKEND, engine="mock", setting="guided-decoding backend")
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        guide: Guide = ChoiceGuide(guidance.choices)
    elif guidance.mode == pb.GUIDED_DECODING_MODE_REGEX:
        if len(guidance.spec) > MAX_PATTERN_CHARS:
            raise InvalidArgument(f"guided.regex is longer than this engine's {MAX_PATTERN_CHARS} characters")
        check_cost(guidance.spec)
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


def make_guides(guidance: Guidance, count: int) -> list[Guide]:
    """One guide for each of ``count`` outputs, checked once (``make_guide``)."""
    first = make_guide(guidance)
    return [first, *(first.fresh() for _ in range(count - 1))]


__all__ = [
    "GUIDE_BACKEND",
    "MAX_UNROLLED",
    "ChoiceGuide",
    "Guide",
    "RegexGuide",
    "check_cost",
    "make_guide",
    "make_guides",
]
