"""A byte-level tokenizer: one token per UTF-8 byte, plus BOS and EOS.

Byte tokens make every string representable and make streaming text honest: a multi-byte
character spans several tokens, so ``TextDecoder`` must (and does) hold back partial
characters instead of emitting half of one.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Iterable, Sequence

from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Media, vocabulary_digest

BYTE_TOKENS = 256
BOS = 256
EOS = 257
VOCAB_SIZE = 258

MEDIA_TOKENS = 8
"""Placeholder tokens each media item contributes (derived from its content)."""

_SPECIAL_PIECES = {BOS: "<s>", EOS: "</s>"}


def encode(text: str, *, bos: bool = True) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes, after a BOS unless ``bos`` is False."""
    ids = list(text.encode("utf-8"))
    return [BOS, *ids] if bos else ids


def decode(token_ids: Iterable[int]) -> str:
    """The text of ``token_ids``; special tokens have no text, invalid bytes become U+FFFD."""
    return bytes(t for t in token_ids if t < BYTE_TOKENS).decode("utf-8", errors="replace")


def _display(token_id: int) -> str:
    """``piece``, computed (``piece`` reads it from a table for ids in the vocabulary)."""
    if token_id >= BYTE_TOKENS:
        return _SPECIAL_PIECES.get(token_id, f"<unk:{token_id}>")
    if 0x20 <= token_id < 0x7F or token_id in (0x09, 0x0A, 0x0D):
        return chr(token_id)
    return f"<0x{token_id:02X}>"


_PIECES = tuple(_display(token_id) for token_id in range(VOCAB_SIZE))


def piece(token_id: int) -> str:
    """A token's display form: the character for printable ASCII, ``<0xNN>`` for other bytes."""
    return _PIECES[token_id] if token_id < VOCAB_SIZE else _display(token_id)


TOKENIZER_ID = vocabulary_digest({piece(token_id): token_id for token_id in range(VOCAB_SIZE)}, (BOS, EOS))
"""``EngineFacts.tokenizer_id``: every mock engine shares this one tokenizer, whatever its settings."""


def media_tokens(media: Media) -> list[int]:
    """A media item as ``MEDIA_TOKENS`` byte tokens hashed from its modality and content.

    The mock does not fetch or decode media; the item's identity (bytes, data URI or URL)
    still changes the prompt, so different media give different outputs.
    """
    content = media.raw_bytes if media.raw_bytes is not None else (media.data_uri or media.url or "").encode()
    return list(hashlib.blake2b(bytes((media.modality,)) + content, digest_size=MEDIA_TOKENS).digest())


def encode_input(
    text: str | None, token_ids: Sequence[int] | None, media: Sequence[Media] = (), *, bos: bool = True
) -> list[int]:
    """A prompt's tokens: media placeholders, then the text's bytes (after BOS) or the given ids.

    Raises ``InvalidArgument`` for a token id outside the vocabulary.
    """
    placeholders = [t for item in media for t in media_tokens(item)]
    if token_ids is not None:
        bad = next((t for t in token_ids if not 0 <= t < VOCAB_SIZE), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
        return [*placeholders, *token_ids]
    head = [BOS] if bos else []
    return [*head, *placeholders, *encode(text or "", bos=False)]


class TextDecoder:
    """Incremental detokenization: each call returns only complete new characters."""

    __slots__ = ("_decoder", "_holding")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._holding = False
        """Whether the codec holds bytes of an unfinished character."""

    def feed(self, token_id: int) -> str:
        """New text after ``token_id`` (empty while a character is incomplete, or for specials)."""
        if token_id >= BYTE_TOKENS:
            return ""
        if token_id < 0x80 and not self._holding:
            return chr(token_id)  # what the codec would return, without its per-call cost
        text = self._decoder.decode(bytes((token_id,)))
        self._holding = bool(self._decoder.getstate()[0])
        return text

    def flush(self) -> str:
        """The end of the output: an unfinished character becomes U+FFFD."""
        self._holding = False
        return self._decoder.decode(b"", final=True)


__all__ = [
    "BOS",
    "BYTE_TOKENS",
    "EOS",
    "MEDIA_TOKENS",
    "TOKENIZER_ID",
    "VOCAB_SIZE",
    "TextDecoder",
    "decode",
    "encode",
    "encode_input",
    "media_tokens",
    "piece",
]
