"""The byte-level tokenizer and incremental UTF-8 detokenization."""

from __future__ import annotations

import random

import pytest
from openengine_backends.mock.tokenizer import (
    BOS,
    EOS,
    MEDIA_TOKENS,
    TOKENIZER_ID,
    VOCAB_SIZE,
    TextDecoder,
    decode,
    encode,
    encode_input,
    media_tokens,
    piece,
)
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Media, vocabulary_digest

TEXT = "héllo €uro 😀!"


def test_encode_is_bos_then_utf8_bytes() -> None:
    assert encode("hé") == [BOS, 0x68, 0xC3, 0xA9]
    assert encode("hé", bos=False) == [0x68, 0xC3, 0xA9]
    assert decode(encode(TEXT)) == TEXT


def test_specials_have_no_text_and_named_pieces() -> None:
    assert decode([BOS, 0x61, EOS]) == "a"
    assert (piece(BOS), piece(EOS), piece(ord("a")), piece(0x0A), piece(0xC3)) == ("<s>", "</s>", "a", "\n", "<0xC3>")
    assert VOCAB_SIZE == 258


def test_decoder_never_emits_half_a_character() -> None:
    decoder = TextDecoder()
    pieces = [decoder.feed(token) for token in encode(TEXT)]
    assert "".join(pieces) + decoder.flush() == TEXT
    for text in pieces:
        assert "\ufffd" not in text
    # the four bytes of the emoji: nothing until the last one completes it
    emoji_at = encode(TEXT).index(0xF0)
    assert pieces[emoji_at : emoji_at + 4] == ["", "", "", "😀"]


def test_decoder_flushes_an_unfinished_character_as_replacement() -> None:
    decoder = TextDecoder()
    assert decoder.feed(0x61) == "a"
    assert decoder.feed(0xE2) == ""
    assert decoder.feed(EOS) == ""
    assert decoder.flush() == "\ufffd"


def test_encode_input_validates_ids_and_places_media_first() -> None:
    assert encode_input(None, [1, 2, 257]) == [1, 2, 257]
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        encode_input(None, [1, 258])
    image = Media(pb.MODALITY_IMAGE, raw_bytes=b"\x89PNG...")
    tokens = encode_input("hi", None, (image,))
    assert tokens[0] == BOS
    assert tokens[1 : 1 + MEDIA_TOKENS] == media_tokens(image)
    assert tokens[1 + MEDIA_TOKENS :] == [ord("h"), ord("i")]


def test_media_tokens_depend_on_content_and_modality() -> None:
    first = media_tokens(Media(pb.MODALITY_IMAGE, url="https://a.example/x.png"))
    assert first == media_tokens(Media(pb.MODALITY_IMAGE, url="https://a.example/x.png"))
    assert first != media_tokens(Media(pb.MODALITY_IMAGE, url="https://a.example/y.png"))
    assert first != media_tokens(Media(pb.MODALITY_VIDEO, url="https://a.example/x.png"))
    assert all(0 <= t < 256 for t in first)


def test_decoder_matches_the_utf8_codec_on_any_byte_stream() -> None:
    # ASCII skips the codec unless it holds part of a character: then the codec must see it
    decoder = TextDecoder()
    assert [decoder.feed(t) for t in (0xE2, 0x82, 0x61, 0xC3, 0xA9)] == ["", "", "\ufffda", "", "é"]
    rng = random.Random(7)
    alphabet = [*range(0x20, 0x7F), *range(0x80, 0x100), BOS, EOS]
    for _ in range(300):
        tokens = [rng.choice(alphabet) for _ in range(rng.randrange(1, 30))]
        decoder = TextDecoder()
        assert "".join(decoder.feed(t) for t in tokens) + decoder.flush() == decode(tokens), tokens


def test_pieces_cover_the_vocabulary_and_beyond() -> None:
    assert [piece(t) for t in (0x09, 0x7E, 0x7F, 0xFF)] == ["\t", "~", "<0x7F>", "<0xFF>"]
    assert piece(VOCAB_SIZE) == f"<unk:{VOCAB_SIZE}>"


def test_the_tokenizer_id_digests_every_token_once() -> None:
    """Each id's piece is distinct, so the digested vocabulary is the whole id table, specials included."""
    vocab = {piece(token_id): token_id for token_id in range(VOCAB_SIZE)}
    assert len(vocab) == VOCAB_SIZE
    assert vocabulary_digest(vocab, (BOS, EOS)) == TOKENIZER_ID
