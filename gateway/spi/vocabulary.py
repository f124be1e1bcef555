"""A tokenizer's identity, so the gateway can tell whether two engines read token ids alike.

Engines behind one served name (a split) may take a request's token ids only when their
tokenizers agree on what every id means. A driver computes ``vocabulary_digest`` from its
tokenizer's vocabulary and special ids and reports it as ``EngineFacts.tokenizer_id``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping


def vocabulary_digest(vocab: Mapping[str, int], special_ids: Iterable[int] = ()) -> str:
    """A SHA-256 hex digest of ``vocab`` (token -> id) and the special token ids.

    Stable across processes and machines: it hashes a canonical encoding (entries sorted by id,
    then token; special ids sorted and deduplicated), never Python's seeded ``hash``. Equal
    digests mean equal vocabularies; the order of the mapping or of ``special_ids`` is not part
    of it.
    """
    canonical = {
        "vocab": sorted([int(token_id), token] for token, token_id in vocab.items()),
        "special_ids": sorted({int(token_id) for token_id in special_ids}),
    }
    encoded = json.dumps(canonical, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()


__all__ = ["vocabulary_digest"]
