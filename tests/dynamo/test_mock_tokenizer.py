"""The tokenizer files Dynamo's sidecar and frontend get for the mock make the mock's own token ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_backends.mock.tokenizer import BOS, EOS, decode, encode

from tests.dynamo.mock_tokenizer import write_model_directory

TEXT = "plain ASCII, tabs\t and newlines\n, héllo wörld, € and 😀, control bytes \x00\x7f"


def test_the_tokenizer_json_encodes_and_decodes_as_the_mock_does(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    directory = write_model_directory(tmp_path / "mock-model", max_positions=4096)
    tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    ids = encode(TEXT, bos=False)
    assert tokenizer.encode(TEXT).ids == ids
    assert tokenizer.decode(ids) == decode(ids) == TEXT
    assert tokenizer.decode([BOS, *ids, EOS], skip_special_tokens=True) == TEXT
    assert (tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")) == (BOS, EOS)
