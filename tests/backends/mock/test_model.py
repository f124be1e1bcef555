"""The seeded pseudo-model: deterministic, real distributions that depend on context and adapter."""

from __future__ import annotations

import random

import numpy as np
from openengine_backends.mock.model import CONTINUATION_ROWS, FREE_ROWS, PseudoModel, build_tables
from openengine_backends.mock.tokenizer import BOS, EOS, encode


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


def _reference_row(seed: int, context: list[int], lora_id: int = 0) -> int:
    """The row as documented: FNV-1a of the last four tokens from a seeded root, masked every step,
    then splitmix64; a continuation row while the trailing bytes are an unfinished character."""
    mask = (1 << 64) - 1

    def mix(value: int) -> int:
        value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & mask
        value = (value ^ (value >> 27)) * 0x94D049BB133111EB & mask
        return value ^ (value >> 31)

    key = mix((seed * 0x9E3779B97F4A7C15 + lora_id) & mask)
    for token in context[-4:]:
        key = ((key ^ token) * 0x100000001B3) & mask
    key = mix(key)
    trailing = 0
    while trailing < min(4, len(context)) and 0x80 <= context[-1 - trailing] <= 0xBF:
        trailing += 1
    lead = context[-1 - trailing] if trailing < len(context) else 0
    needed = 1 if 0xC2 <= lead <= 0xDF else 2 if 0xE0 <= lead <= 0xEF else 3 if 0xF0 <= lead <= 0xF4 else 0
    return FREE_ROWS + key % CONTINUATION_ROWS if trailing < needed else key % FREE_ROWS


def test_rows_follow_the_documented_hash() -> None:
    rng = random.Random(3)
    bytes_and_specials = [*range(0x20, 0x7F), *range(0x80, 0x100), BOS, EOS]
    for seed, lora_id in ((0, 0), (7, 0), (7, 3)):
        model = PseudoModel(seed)
        for _ in range(2000):
            context = [rng.choice(bytes_and_specials) for _ in range(rng.randrange(0, 9))]
            assert model.row(context, lora_id) == _reference_row(seed, context, lora_id), context
            end = rng.randrange(0, len(context) + 1)
            assert model.row_at(context, end, lora_id) == _reference_row(seed, context[:end], lora_id), context


def test_best_is_the_first_of_each_order() -> None:
    tables = PseudoModel(0).tables
    assert tables.best == tuple(int(t) for t in tables.order[:, 0])


def test_draw_is_the_inverse_cdf_of_the_row() -> None:
    model = PseudoModel(0)
    tables = model.tables
    rng = random.Random(5)
    for _ in range(2000):
        row = rng.randrange(len(tables.cdf))
        uniform = rng.choice((rng.random(), float(tables.cdf[row, rng.randrange(258)]), 1.0, 0.0))
        index = min(int(np.searchsorted(tables.cdf[row], uniform, side="right")), tables.cdf.shape[1] - 1)
        assert model.draw(row, uniform) == int(tables.order[row, index])


def test_a_forgotten_adapter_hashes_as_before() -> None:
    model = PseudoModel(0)
    context = encode("adapter")
    before = model.row(context, lora_id=9)
    model.forget(9)
    assert model.row(context, lora_id=9) == before == _reference_row(0, context, 9)


def test_per_adapter_tables_stay_bounded_whatever_ids_are_used() -> None:
    """A request still running with an adapter when it is unloaded builds its table again after
    ``forget``; adapter ids are the caller's, so the tables are bounded, and rows stay exact."""
    from openengine_backends.mock.model import ADAPTER_TABLES

    model = PseudoModel(0)
    context = encode("a long enough context")
    rows = {lora_id: model.row(context, lora_id) for lora_id in range(1, 5 * ADAPTER_TABLES)}
    assert len(model._first_steps) == ADAPTER_TABLES
    assert all(model.row(context, lora_id) == row for lora_id, row in rows.items())
