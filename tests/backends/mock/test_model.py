"""The seeded pseudo-model: deterministic, real distributions that depend on context and adapter."""

from __future__ import annotations

import numpy as np
from openengine_backends.mock.model import FREE_ROWS, PseudoModel, build_tables
from openengine_backends.mock.tokenizer import EOS, encode


def test_rows_are_real_distributions_with_consistent_tables() -> None:
    tables = PseudoModel(0).tables
    assert np.allclose(np.exp(tables.logprobs).sum(axis=1), 1.0)
    assert np.allclose(tables.cdf[:, -1], 1.0)
    rows = np.arange(len(tables.order))[:, None]
    ordered = tables.logprobs[rows, tables.order]
    assert (np.diff(ordered, axis=1) <= 0).all()
    assert (tables.ranks[rows, tables.order] == np.arange(1, tables.order.shape[1] + 1)).all()
    # log-softmax of the logits
    shifted = tables.logits - tables.logits.max(axis=1, keepdims=True)
    assert np.allclose(tables.logprobs, shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))


def test_same_seed_same_model_other_seed_other_model() -> None:
    assert np.array_equal(build_tables(1).logits, PseudoModel(1).tables.logits)
    assert not np.allclose(build_tables(1).logits, build_tables(2).logits)
    context = encode("hello")
    assert PseudoModel(1).row(context) == PseudoModel(1).row(context)


def test_row_depends_on_recent_context_and_adapter() -> None:
    model = PseudoModel(0)
    rows = {model.row(encode(word)) for word in ("cat", "dog", "cow", "pig", "ant", "bee")}
    assert len(rows) > 3
    # only the last few tokens matter
    assert model.row(encode("xxxx the end")) == model.row(encode("yyyy the end"))
    assert model.row(encode("cat"), lora_id=0) != model.row(encode("cat"), lora_id=7)
    assert model.row_at(encode("a long prompt"), 6) == model.row(encode("a long prompt")[:6])


def test_unfinished_utf8_selects_a_continuation_row() -> None:
    model = PseudoModel(0)
    lead = [*encode("caf"), 0xC3]
    row = model.row(lead)
    assert row >= FREE_ROWS
    assert 0x80 <= model.top(row, 1)[0] <= 0xBF
    assert model.row([*lead, 0xA9]) < FREE_ROWS


def test_eos_is_likely_enough_for_outputs_to_end() -> None:
    tables = PseudoModel(0).tables
    free = tables.logprobs[:FREE_ROWS, EOS]
    assert 0.01 < np.exp(free).mean() < 0.05
    assert 0.01 < (tables.order[:FREE_ROWS, 0] == EOS).mean() < 0.06
