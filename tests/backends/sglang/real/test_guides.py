"""The driver's guides compiled by SGLang's own grammar backends for the tiny Llama's tokenizer.

SGLang's scheduler compiles the ``json_schema`` / ``regex`` / ``ebnf`` / ``structural_tag`` of a
request with the engine's backend (``constrained/xgrammar_backend.py``, ``llguidance_backend.py``)
after acceptance; a guide it cannot compile becomes an ``InvalidGrammarObject`` and the request
fails. The driver advertises every mode on both backends and refuses, before acceptance, the one
form llguidance cannot compile: so every guide it sends must compile.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, mapping
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Guidance

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
LEGACY_TAG = json.dumps(
    {"structures": [{"begin": "call(", "schema": {"type": "object"}, "end": ")"}], "triggers": ["call("]}
)
FORMAT_TAG = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}})
GUIDES = [
    Guidance(pb.GUIDED_DECODING_MODE_JSON_SCHEMA, spec=SCHEMA),
    Guidance(pb.GUIDED_DECODING_MODE_JSON_OBJECT),
    Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="[0-9]{1,3}"),
    Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("yes", "no.", "a|b", "(x)", "1+1=2?")),
    Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, spec='root ::= "a" | "b"'),
    Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec=LEGACY_TAG),
    Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec=FORMAT_TAG),
]


def backend(name: str, manager: Any) -> Any:
    """The backend SGLang's ``create_grammar_backend`` builds for ``--grammar-backend name``."""
    vocab, eos = manager.model_config.vocab_size, [manager.tokenizer.eos_token_id]
    if name == "xgrammar":
        from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

        return XGrammarGrammarBackend(manager.tokenizer, vocab_size=vocab, model_eos_token_ids=eos)
    from sglang.srt.constrained.llguidance_backend import GuidanceBackend

    return GuidanceBackend(manager.tokenizer, n_vocab=vocab, eos_token_ids=eos)


def compiled(grammars: Any, fields: dict[str, str]) -> Any:
    """What the scheduler's grammar manager compiles for a request's one grammar field."""
    ((field, spec),) = fields.items()
    kind = "json" if field == "json_schema" else field
    return getattr(grammars, f"dispatch_{kind}")(spec)


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("guidance", GUIDES, ids=lambda g: pb.GuidedDecodingMode.Name(g.mode))
def test_every_guide_the_driver_sends_compiles(tokenizer_manager: Any, name: str, guidance: Guidance) -> None:
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    assert guidance.mode in capabilities.GUIDED_MODES_BY_BACKEND[name], "advertised"
    try:
        fields = mapping.guided_fields(guidance, name)
    except InvalidArgument:
        assert (name, guidance.spec) == ("llguidance", FORMAT_TAG), "only llguidance's unknown tag form is refused"
        assert isinstance(
            compiled(backend(name, tokenizer_manager), {"structural_tag": FORMAT_TAG}), InvalidGrammarObject
        )
        return
    grammar = compiled(backend(name, tokenizer_manager), fields)
    assert not isinstance(grammar, InvalidGrammarObject), getattr(grammar, "error_message", grammar)


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_a_choice_matches_exactly_its_options(tokenizer_manager: Any, name: str) -> None:
    """The choice regex accepts each option's tokens to the end, and nothing else."""
    choices = ("yes", "no.", "a|b")
    grammars = backend(name, tokenizer_manager)

    guide = mapping.guided_fields(Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=choices), name)
    eos = tokenizer_manager.tokenizer.eos_token_id

    def accepts(text: str) -> bool:
        """The text's tokens and then EOS are accepted, as the scheduler feeds them (a rejected one raises)."""
        grammar = compiled(grammars, guide)
        try:
            for token in [*tokenizer_manager.tokenizer.encode(text, add_special_tokens=False), eos]:
                grammar.accept_token(token)
        except Exception:  # broad on purpose: each backend raises its own error for a rejected token
            return False
        return bool(grammar.is_terminated())

    for choice in choices:
        assert accepts(choice), choice
    assert not accepts("a"), "the | of an option is literal"
