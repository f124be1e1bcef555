"""A model directory whose tokenizer is the mock engine's own, for Dynamo's sidecar and frontend.

The sidecar needs only tokenizer files (``--model-path DIR``): it sends the engine token ids, and the
frontend turns a prompt into them with ``DIR/tokenizer.json``. The mock's vocabulary
(``openengine_backends.mock.tokenizer``) is one token per UTF-8 byte, id = byte value, then BOS and
EOS. A byte-level BPE with no merges has exactly that: the ByteLevel pre-tokenizer maps each byte to
one printable character (GPT-2's table), and the vocabulary gives that character the byte's value as
its id. No post-processor adds BOS: the mock adds it itself to a text prompt only, and a prompt sent
as ids is taken as it is, so the ids the frontend computes are the ones the mock would see.
"""

from __future__ import annotations

import json
from pathlib import Path

from openengine_backends.mock.tokenizer import BOS, BYTE_TOKENS, EOS, piece


def byte_characters() -> dict[int, str]:
    """GPT-2's byte-to-character table, which the ByteLevel pre-tokenizer applies: printable Latin-1
    bytes stand for themselves, the others for characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = (b for b in range(BYTE_TOKENS) if b not in printable)
    table = {b: chr(b) for b in printable}
    table.update({b: chr(BYTE_TOKENS + n) for n, b in enumerate(shifted)})
    return table


def write_model_directory(directory: Path, *, max_positions: int) -> Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and a ``config.json`` (which Dynamo reads
    for the model's architectural limit, ``max_positions``) into ``directory``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {character: b for b, character in byte_characters().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(piece(BOS), special=True), AddedToken(piece(EOS), special=True)])
    assert tokenizer.token_to_id(piece(BOS)) == BOS and tokenizer.token_to_id(piece(EOS)) == EOS
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": piece(BOS), "eos_token": piece(EOS), "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    model = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": EOS + 1,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "max_position_embeddings": max_positions,
    }
    (directory / "config.json").write_text(json.dumps(model))
    return directory
