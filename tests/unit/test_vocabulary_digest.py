"""``spi.vocabulary_digest``: one identity per vocabulary, the same in every process."""

from __future__ import annotations

import os
import subprocess
import sys

from openengine_gateway.spi import vocabulary_digest

VOCAB = {"<s>": 0, "</s>": 1, "a": 2, "é": 3, "\u2581the": 4}


def test_equal_vocabularies_give_equal_digests_whatever_their_order() -> None:
    reordered = dict(reversed(list(VOCAB.items())))
    assert vocabulary_digest(VOCAB, [1, 0]) == vocabulary_digest(reordered, (0, 1, 1))
    assert len(vocabulary_digest(VOCAB)) == 64


def test_any_difference_in_ids_tokens_or_specials_changes_it() -> None:
    digest = vocabulary_digest(VOCAB, [0, 1])
    assert vocabulary_digest({**VOCAB, "a": 5}, [0, 1]) != digest
    assert vocabulary_digest({**VOCAB, "b": 5}, [0, 1]) != digest
    assert vocabulary_digest({k if k != "a" else "A": v for k, v in VOCAB.items()}, [0, 1]) != digest
    assert vocabulary_digest(VOCAB, [0]) != digest


def test_it_is_the_same_in_another_process() -> None:
    """No seeded ``hash``: a process with other hash seeds computes the same digest."""
    code = f"from openengine_gateway.spi import vocabulary_digest; print(vocabulary_digest({VOCAB!r}, [1, 0]))"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == vocabulary_digest(VOCAB, [0, 1])
