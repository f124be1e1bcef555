"""The vLLM engine's tokenizer identity, from the shape of vLLM's ``TokenizerLike``."""

from __future__ import annotations

from dataclasses import dataclass, field

from openengine_backends.vllm.startup import tokenizer_id
from openengine_gateway.spi import vocabulary_digest


@dataclass
class Tokenizer:
    """``vllm.tokenizers.protocol.TokenizerLike``: the two members the identity reads."""

    vocab: dict[str, int]
    all_special_ids: list[int] = field(default_factory=list)

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_the_id_digests_the_vocabulary_and_the_special_ids() -> None:
    tokenizer = Tokenizer({"<s>": 0, "a": 1, "b": 2}, [0])
    assert tokenizer_id(tokenizer) == vocabulary_digest({"<s>": 0, "a": 1, "b": 2}, [0])
    assert tokenizer_id(tokenizer) != tokenizer_id(Tokenizer({"<s>": 0, "a": 1, "b": 2}))
    assert tokenizer_id(tokenizer) != tokenizer_id(Tokenizer({"<s>": 0, "a": 2, "b": 1}, [0]))


def test_an_engine_without_a_tokenizer_has_no_id() -> None:
    assert tokenizer_id(None) is None
