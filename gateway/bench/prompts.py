"""Prompt text: synthetic text of an exact length, or the prompts of a file (JSONL or lines)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from .errors import WorkloadError

_VOCABULARY = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there one all we their can has been if more when will would who so no time "
    "about model token engine cache prefix stream batch decode latency sample request river stone light "
    "garden"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class PromptEntry:
    """A prompt from a file, with the output length it asks for when the file gives one."""

    text: str
    output_length: int | None = None


def synthetic_text(rng: random.Random, length: int) -> str:
    """``length`` characters of seeded space-separated words (ASCII: one byte each)."""
    words: list[str] = []
    size = 0  # of the words and a space after each: the joined text is one shorter
    while size <= length:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


def load_prompts(path: Path) -> tuple[PromptEntry, ...]:
    """The prompts of ``path``.

    A ``.jsonl`` or ``.json`` file holds one object a line, ``{"prompt": "...", "output_len": 128}``
    (the output length is optional); a ``.json`` file may instead hold one array of such objects.
    Any other file holds one prompt a line. Blank lines are skipped.
    """
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        items = _json(text, str(path))
        if not isinstance(items, list):
            raise WorkloadError(f"{path}: not one JSON array of prompt objects")
        entries = [_entry(item, f"{path}: item {number}") for number, item in enumerate(items, 1)]
    else:
        jsonl = path.suffix in (".jsonl", ".json")
        entries = [
            _entry(_json(line, where := f"{path}:{number}"), where) if jsonl else PromptEntry(line)
            for number, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    if not entries:
        raise WorkloadError(f"{path} holds no prompts")
    return tuple(entries)


def _json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise WorkloadError(f"{where}: not JSON: {error}") from None


def _entry(item: object, where: str) -> PromptEntry:
    prompt = item.get("prompt") if isinstance(item, dict) else None
    output_length = item.get("output_len") if isinstance(item, dict) else None
    if not isinstance(prompt, str) or not prompt:
        raise WorkloadError(f'{where}: needs a non-empty string "prompt"')
    if output_length is not None and (type(output_length) is not int or output_length < 1):
        raise WorkloadError(f'{where}: "output_len" must be a positive integer')
    return PromptEntry(prompt, output_length)


__all__ = ["PromptEntry", "load_prompts", "synthetic_text"]
