"""The started vLLM engine reports its tokenizer's identity: the digest of the tiny model's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from openengine_gateway.spi import vocabulary_digest
from openengine_gateway.testing import RunningGateway

pytestmark = pytest.mark.vllm


def test_the_tokenizer_id_is_the_digest_of_the_model_s_tokenizer(gateway: RunningGateway, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    (engine,) = gateway.gateway.engines
    assert engine.facts.tokenizer_id is not None
    assert engine.facts.tokenizer_id == vocabulary_digest(tokenizer.get_vocab(), tokenizer.all_special_ids)
