"""``Sampling.require_neutral``: a knob the engine does not implement is refused unless neutral."""

from __future__ import annotations

import pytest
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import Sampling


def test_unset_and_neutral_values_pass() -> None:
    Sampling().require_neutral(*Sampling.KNOBS, "seed", engine="echo")
    neutral = Sampling(**{name: Sampling.NEUTRAL[name] for name in Sampling.KNOBS})
    neutral.require_neutral(*Sampling.KNOBS, engine="echo")


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (Sampling(temperature=0.7), r"sampling.temperature: echo does not implement it \(only 1\), got 0.7"),
        (Sampling(top_k=5), r"sampling.top_k: .* \(only 0\), got 5"),
        (Sampling(repetition_penalty=1.2), r"sampling.repetition_penalty: .* \(only 1\), got 1.2"),
        (Sampling(seed=7), r"sampling.seed: echo does not implement it, got 7"),
    ],
)
def test_a_non_neutral_value_is_invalid_argument(sampling: Sampling, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        sampling.require_neutral(*Sampling.KNOBS, "seed", engine="echo")


def test_only_the_named_knobs_are_checked() -> None:
    Sampling(temperature=0.0).require_neutral("top_p", engine="echo")
