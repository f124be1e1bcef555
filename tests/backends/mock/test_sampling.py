"""Every sampling knob acts on the pseudo-model's real distributions."""

from __future__ import annotations

import collections

import numpy as np
from openengine_backends.mock.model import PseudoModel
from openengine_backends.mock.sampling import Sampler, output_rng
from openengine_backends.mock.tokenizer import EOS, VOCAB_SIZE, encode
from openengine_gateway.spi import Sampling

MODEL = PseudoModel(0)
ROW = MODEL.row(encode("sampling"))
PROBS = np.exp(MODEL.tables.logprobs[ROW])


def draws(count: int = 4000, row: int = ROW, seed: int = 0, **knobs: float | int) -> collections.Counter[int]:
    sampler = Sampler(MODEL, Sampling(**knobs), np.random.default_rng(seed), encode("p"))  # type: ignore[arg-type]
    return collections.Counter(sampler.sample(row) for _ in range(count))


def test_greedy_is_the_argmax() -> None:
    assert draws(50, temperature=0.0) == {MODEL.top(ROW, 1)[0]: 50}


def test_plain_sampling_follows_the_distribution() -> None:
    counts = draws(20000)
    for token in MODEL.top(ROW, 5):
        assert abs(counts[token] / 20000 - PROBS[token]) < 0.015


def test_temperature_sharpens_and_flattens() -> None:
    def entropy(counts: collections.Counter[int]) -> float:
        p = np.array(list(counts.values())) / sum(counts.values())
        return float(-(p * np.log(p)).sum())

    assert entropy(draws(temperature=0.3)) < entropy(draws(temperature=1.0)) < entropy(draws(temperature=2.0))


def test_top_k_keeps_only_the_k_best() -> None:
    assert set(draws(top_k=3)) <= set(MODEL.top(ROW, 3))
    assert len(draws(top_k=3)) == 3
    assert set(draws(200, top_k=1)) == {MODEL.top(ROW, 1)[0]}


def test_top_p_keeps_the_nucleus() -> None:
    order = MODEL.top(ROW, VOCAB_SIZE)
    cumulative = np.cumsum(PROBS[order])
    nucleus = order[: int(np.searchsorted(cumulative, 0.5)) + 1]
    counts = draws(top_p=0.5)
    assert set(counts) <= set(nucleus)
    assert len(counts) == len(nucleus)


def test_min_p_drops_unlikely_tokens() -> None:
    threshold = 0.3 * PROBS.max()
    counts = draws(min_p=0.3)
    assert all(PROBS[token] >= threshold for token in counts)
    assert set(counts) == {t for t in range(VOCAB_SIZE) if PROBS[t] >= threshold}


def test_penalties_discourage_what_was_generated() -> None:
    top = MODEL.top(ROW, 1)[0]
    for knobs in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 3.0}):
        sampler = Sampler(MODEL, Sampling(temperature=0.0, **knobs), np.random.default_rng(0), [])  # type: ignore[arg-type]
        assert sampler.sample(ROW) == top
        sampler.observe(top)
        assert sampler.sample(ROW) != top, knobs
    # repetition also covers the prompt
    prompted = Sampler(MODEL, Sampling(temperature=0.0, repetition_penalty=3.0), np.random.default_rng(0), [top])
    assert prompted.sample(ROW) != top


def test_banned_and_allowed_tokens() -> None:
    eos_row = int(np.argmax(MODEL.tables.order[:, 0] == EOS))
    sampler = Sampler(MODEL, Sampling(temperature=0.0), np.random.default_rng(0), [])
    assert sampler.sample(eos_row) == EOS
    assert sampler.sample(eos_row, banned=(EOS,)) == MODEL.top(eos_row, 2)[1]
    allowed = np.zeros(VOCAB_SIZE, dtype=bool)
    allowed[[ord("x"), ord("y")]] = True
    hot = Sampler(MODEL, Sampling(temperature=1.5), np.random.default_rng(0), [])
    assert {hot.sample(ROW, allowed=allowed) for _ in range(200)} == {ord("x"), ord("y")}
    # a ban that would leave nothing allowed yields to the guidance
    only_eos = np.zeros(VOCAB_SIZE, dtype=bool)
    only_eos[EOS] = True
    assert hot.sample(ROW, banned=(EOS,), allowed=only_eos) == EOS


def test_seeds_reproduce_and_separate_outputs() -> None:
    fallback = np.random.default_rng(0)

    def sequence(seed: int | None, index: int) -> list[int]:
        sampler = Sampler(MODEL, Sampling(top_p=0.9), output_rng(seed, index, fallback), [])
        return [sampler.sample(ROW) for _ in range(30)]

    assert sequence(7, 0) == sequence(7, 0)
    assert sequence(7, 0) != sequence(7, 1)
    assert sequence(7, 0) != sequence(8, 0)
    assert sequence(None, 0) != sequence(None, 0)


def test_output_generators_are_seeded_at_creation_and_draw_as_numpy_would() -> None:
    fallback, replay = np.random.default_rng(5), np.random.default_rng(5)
    unseeded = [output_rng(None, index, fallback) for index in range(2)]
    entropy = [int(replay.integers(1 << 63)) for _ in range(2)]
    assert fallback.random() == replay.random()  # each output drew from the engine's generator at once
    for rng, value in zip(unseeded, entropy, strict=True):
        reference = np.random.default_rng(value)
        assert [rng.random() for _ in range(3)] == [reference.random() for _ in range(3)]
    seeded, reference = output_rng(9, 2, fallback), np.random.default_rng([9, 2])
    assert [seeded.random() for _ in range(3)] == [reference.random() for _ in range(3)]
