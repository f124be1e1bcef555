"""The request-side helpers drivers share: sampling values with model defaults, grammar backends."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Guidance, Sampling


def test_sampling_values_are_what_the_caller_set_then_the_models_defaults() -> None:
    assert Sampling().values() == {}
    given = Sampling(temperature=0.0, top_k=0, repetition_penalty=1.1, seed=3, num_sequences=2)
    assert given.values() == {"temperature": 0.0, "top_k": 0, "repetition_penalty": 1.1}, "present 0 is a value"
    defaults = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 5}
    assert given.values(defaults) == {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.1}


def test_a_guide_needs_the_engines_one_grammar_backend() -> None:
    guide = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a")
    guide.require_backend("xgrammar", engine="E", setting="grammar backend")
    Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a", backend="xgrammar").require_backend(
        "xgrammar", engine="E", setting="grammar backend"
    )
    with pytest.raises(InvalidArgument, match="this E engine was started without a grammar backend"):
        guide.require_backend(None, engine="E", setting="grammar backend")
    with pytest.raises(InvalidArgument, match="differs from this engine's grammar backend 'xgrammar'"):
        Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a", backend="outlines").require_backend(
            "xgrammar", engine="E", setting="grammar backend"
        )
