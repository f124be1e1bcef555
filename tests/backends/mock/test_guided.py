"""Guided decoding masks that really constrain, alone and through generation."""

from __future__ import annotations

import pytest
import regex
from openengine_backends.mock import guided
from openengine_backends.mock.guided import MAX_PATTERN_CHARS, ChoiceGuide, RegexGuide, make_guide
from openengine_backends.mock.tokenizer import EOS, encode
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument
from openengine_gateway.spi import Guidance, Sampling, Stopping

from .support import engine, generate


def allowed_set(guide: ChoiceGuide | RegexGuide) -> set[int]:
    return {int(t) for t in guide.allowed().nonzero()[0]}


def test_choice_guide_walks_the_choices() -> None:
    guide = ChoiceGuide(("yes", "yet", "no"))
    assert allowed_set(guide) == {ord("y"), ord("n")}
    for byte in encode("ye", bos=False):
        guide.advance(byte)
    assert allowed_set(guide) == {ord("s"), ord("t")}
    guide.advance(ord("s"))
    assert allowed_set(guide) == {EOS}


def test_regex_guide_allows_exactly_the_viable_bytes() -> None:
    guide = RegexGuide(regex.compile(r"[0-9]{2}(am|pm)"))
    assert allowed_set(guide) == set(range(ord("0"), ord("9") + 1))
    for byte in encode("12", bos=False):
        guide.advance(byte)
    assert allowed_set(guide) == {ord("a"), ord("p")}
    for byte in encode("pm", bos=False):
        guide.advance(byte)
    assert allowed_set(guide) == {EOS}


def test_regex_guide_handles_literal_non_ascii() -> None:
    guide = RegexGuide(regex.compile(r"caf[eé]!"))
    for byte in encode("caf", bos=False):
        guide.advance(byte)
    assert allowed_set(guide) == {ord("e"), 0xC3}
    guide.advance(0xC3)
    assert allowed_set(guide) == {0xA9}
    guide.advance(0xA9)
    assert allowed_set(guide) == {ord("!")}


def test_make_guide_rejects_bad_and_unsatisfiable_specs() -> None:
    with pytest.raises(InvalidArgument, match="does not compile"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="(unclosed"))
    with pytest.raises(InvalidArgument, match="cannot be satisfied"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec=r"\p{Greek}+"))


def test_a_guide_may_name_only_the_mock_s_own_backend() -> None:
    """An engine serves every guide with its one backend: a request naming another is refused, not rerouted."""
    make_guide(Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("a",), backend=guided.GUIDE_BACKEND))
    with pytest.raises(InvalidArgument, match=r"guided\.backend 'xgrammar' differs"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("a",), backend="xgrammar"))


async def test_a_prefill_engine_checks_the_guide_the_decode_engine_applies() -> None:
    bad = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="(unclosed")
    async with engine(role="prefill") as prefiller:
        with pytest.raises(InvalidArgument, match="does not compile"):
            await generate(prefiller, guidance=bad)
        good = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="[0-9]+")
        assert (await generate(prefiller, guidance=good)).prefill is not None


async def test_generation_follows_a_regex() -> None:
    pattern = r"(red|green|blue)-[0-9]{1,3}"
    async with engine() as backend:
        for seed in range(8):
            result = await generate(
                backend,
                sampling=Sampling(temperature=1.5, seed=seed),
                guidance=Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec=pattern),
            )
            assert regex.fullmatch(pattern, result.text[0]), result.text[0]
            assert result.finished[0].reason == pb.FINISH_REASON_STOP


async def test_generation_picks_one_choice_per_output() -> None:
    choices = ("alpha", "beta", "gamma delta", "ça va")
    async with engine() as backend:
        result = await generate(
            backend,
            sampling=Sampling(temperature=2.0, seed=3, num_sequences=8),
            guidance=Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=choices),
        )
    assert all(text in choices for text in result.text.values())
    assert len(set(result.text.values())) > 1


def test_a_pattern_too_long_or_too_costly_to_match_is_refused_before_acceptance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InvalidArgument, match="longer than"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="x" * (MAX_PATTERN_CHARS + 1)))
    make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="x" * MAX_PATTERN_CHARS))
    monkeypatch.setattr(guided, "MASK_BUDGET_S", 0.0)  # every mask is over budget: the first one too
    with pytest.raises(InvalidArgument, match="too costly"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="[a-z]+"))


def test_a_mask_timed_out_while_the_process_was_off_the_cpu_is_computed_again() -> None:
    """A cheap match cut by the wall clock while the process waited for a CPU (a busy neighbour) is not a
    costly pattern: the budget is CPU time, so the match is tried again (CI once refused ``[a-z]+`` so)."""
    compiled = regex.compile(r"[0-9]{2}")
    timed_out: list[str] = []

    class Starved:
        pattern = compiled.pattern

        def fullmatch(self, text: str, **options: object) -> object:
            if not timed_out:
                timed_out.append(text)  # as regex does when its wall-clock timeout passes first
                raise TimeoutError
            return compiled.fullmatch(text, **options)  # type: ignore[call-overload]

    guide = RegexGuide(Starved())  # type: ignore[arg-type]
    assert allowed_set(guide) == set(range(ord("0"), ord("9") + 1)) and len(timed_out) == 1


async def test_a_pattern_that_turns_costly_fails_its_request_and_nothing_else() -> None:
    """``(a|aa)*`` backtracks exponentially in the output's length: the mask's budget ends it."""
    async with engine() as backend:
        with pytest.raises(EngineFailure, match="too costly") as failure:
            await generate(
                backend,
                stopping=Stopping(max_tokens=60, min_tokens=60),
                guidance=Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="(a|aa)*"),
            )
        assert failure.value.code == pb.ERROR_CODE_INVALID_ARGUMENT and not failure.value.retryable
        assert (await generate(backend, stopping=Stopping(max_tokens=3))).finished, "the engine still serves"


@pytest.mark.parametrize(
    "pattern", ["((a|aa)*)*", "(a|aa){30}((a|aa)*)*c", "(a+)+b", "(?:x*)*", "a{3000}", "((ab){40}){40}"]
)
def test_a_pattern_past_its_cost_bound_is_refused_before_any_match(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guided.RegexGuide, "allowed", lambda _self: pytest.fail("a match ran"))
    with pytest.raises(InvalidArgument, match=r"repeats a repetition|unrolls to over"):
        make_guide(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec=pattern))


@pytest.mark.parametrize(
    "pattern", ["(a|aa)*", "(ab|ba){2}c", "[a-z]+", r"\(a*\)*", "[(]*", "(red|green|blue)-[0-9]{1,3}"]
)
def test_patterns_within_the_bound_pass_it(pattern: str) -> None:
    guided.check_cost(pattern)
