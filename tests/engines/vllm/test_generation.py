"""Generation through the gateway on real vLLM, checked against transformers' forward pass."""

from __future__ import annotations

import math
import re

import pytest

pytest.importorskip("vllm")

from openengine_gateway import pb

from tests.engines.streams import generate_request
from tests.responses import collect, finished, text, tokens

from .reference import TOLERANCE, Reference

pytestmark = pytest.mark.vllm

PROMPT = "the quick brown fox jumps over"
GREEDY = pb.SamplingParams(temperature=0.0)


def no_eos(max_tokens: int) -> pb.StoppingOptions:
    return pb.StoppingOptions(max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token_ids"])
async def test_greedy_ids_logprobs_and_candidates_equal_transformers(
    stub: pb.OpenEngineStub, reference: Reference, as_ids: bool
) -> None:
    prompt_ids = reference.encode(PROMPT)
    request = generate_request(
        f"greedy-{as_ids}",
        prompt=prompt_ids if as_ids else PROMPT,
        sampling=GREEDY,
        stopping=no_eos(16),
        response=pb.ResponseOptions(
            return_output_logprobs=True,
            output_candidates=pb.CandidateTokenSelection(top_n=3),
            return_prompt_logprobs=True,
            prompt_candidates=pb.CandidateTokenSelection(top_n=3),
        ),
    )
    responses = await collect(stub, request)
    expected = reference.greedy(prompt_ids, 16)
    got = tokens(responses)
    assert [t.token_id for t in got] == [step.token_id for step in expected]
    for token, step in zip(got, expected, strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE)
        assert token.rank == step.rank == 1
        top = step.logprobs.topk(3)
        assert [c.token_id for c in token.candidates] == top.indices.tolist()
        assert [c.rank for c in token.candidates] == [1, 2, 3]
        for candidate, value in zip(token.candidates, top.values.tolist(), strict=True):
            assert candidate.logprob == pytest.approx(value, abs=TOLERANCE)
    (prompt,) = [r.prompt for r in responses if r.HasField("prompt")]
    assert [t.token_id for t in prompt.tokens] == prompt_ids
    first = prompt.tokens[0]
    assert not first.HasField("logprob") and not first.HasField("rank") and not first.candidates
    # Every prompt token carries its text, the unscored first one too.
    assert [t.token for t in prompt.tokens] == [reference.tokenizer.decode([i]) for i in prompt_ids]
    for token, step in zip(prompt.tokens[1:], reference.prompt_steps(prompt_ids), strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE) and token.rank == step.rank
        assert [c.token_id for c in token.candidates] == step.logprobs.topk(3).indices.tolist()
    done = finished(responses)[0]
    assert done.reason == pb.FINISH_REASON_LENGTH
    usage = responses[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt_ids), 16)
    assert sum(r.HasField("usage") for r in responses) == 1


async def test_all_candidates(stub: pb.OpenEngineStub, reference: Reference) -> None:
    prompt_ids = reference.encode(PROMPT)
    expected = reference.greedy(prompt_ids, 2)
    every = generate_request(
        "all",
        prompt=prompt_ids,
        sampling=GREEDY,
        stopping=no_eos(2),
        response=pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(all=pb.AllCandidates())),
    )
    for token, step in zip(tokens(await collect(stub, every)), expected, strict=True):
        assert len(token.candidates) == 512
        assert math.fsum(math.exp(c.logprob) for c in token.candidates) == pytest.approx(1.0, abs=1e-4)
        assert [c.rank for c in token.candidates] == list(range(1, 513))
        for candidate in token.candidates[:50]:
            assert candidate.logprob == pytest.approx(float(step.logprobs[candidate.token_id]), abs=TOLERANCE)


async def test_output_candidate_ids_where_the_engine_scores_them(stub: pb.OpenEngineStub, reference: Reference) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(model="tiny"))
    if pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS not in info.generation.output_logprobs.candidate_selection_modes:
        pytest.skip("vLLM scores output candidate ids right with model runner V2 only (GPU); not advertised here")
    prompt_ids = reference.encode(PROMPT)
    expected = reference.greedy(prompt_ids, 2)
    ids = [7, 300, expected[0].token_id]
    chosen = generate_request(
        "ids",
        prompt=prompt_ids,
        sampling=GREEDY,
        stopping=no_eos(2),
        response=pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=ids))),
    )
    for token, step in zip(tokens(await collect(stub, chosen)), expected, strict=True):
        assert [c.token_id for c in token.candidates] == ids
        assert not any(c.HasField("rank") for c in token.candidates)
        for candidate in token.candidates:
            assert candidate.logprob == pytest.approx(float(step.logprobs[candidate.token_id]), abs=TOLERANCE)


async def test_prompt_logprobs_from_a_start_position(stub: pb.OpenEngineStub, reference: Reference) -> None:
    prompt_ids = reference.encode(PROMPT)
    request = generate_request(
        "prompt-start",
        prompt=prompt_ids,
        stopping=no_eos(1),
        response=pb.ResponseOptions(return_prompt_logprobs=True, prompt_logprob_start=3),
    )
    (prompt,) = [r.prompt for r in await collect(stub, request) if r.HasField("prompt")]
    assert [t.token_id for t in prompt.tokens] == prompt_ids[3:]
    for token, step in zip(prompt.tokens, reference.prompt_steps(prompt_ids)[2:], strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE) and not token.candidates


async def test_prompt_candidate_ids_where_the_engine_scores_them(stub: pb.OpenEngineStub, reference: Reference) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(model="tiny"))
    if pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS not in info.generation.prompt_logprobs.candidate_selection_modes:
        pytest.skip("vLLM scores prompt candidate ids with model runner V2 only (GPU); not advertised here")
    prompt_ids = reference.encode(PROMPT)
    ids = [3, 300]
    request = generate_request(
        "prompt-ids",
        prompt=prompt_ids,
        stopping=no_eos(1),
        response=pb.ResponseOptions(
            prompt_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=ids)), prompt_logprob_start=2
        ),
    )
    (prompt,) = [r.prompt for r in await collect(stub, request) if r.HasField("prompt")]
    for token, step in zip(prompt.tokens, reference.prompt_steps(prompt_ids)[1:], strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE)
        assert [c.token_id for c in token.candidates] == ids
        for candidate in token.candidates:
            assert candidate.logprob == pytest.approx(float(step.logprobs[candidate.token_id]), abs=TOLERANCE)


async def test_stop_token_is_dropped_unless_included(stub: pb.OpenEngineStub, reference: Reference) -> None:
    prompt_ids = reference.encode(PROMPT)
    greedy = [step.token_id for step in reference.greedy(prompt_ids, 8)]
    stop = greedy[4]
    cut = greedy.index(stop)
    for include in (False, True):
        request = generate_request(
            f"stop-token-{include}",
            prompt=prompt_ids,
            sampling=GREEDY,
            stopping=pb.StoppingOptions(
                max_tokens=8,
                ignore_eos=True,
                conditions=[pb.StopCondition(stop_token_id=stop)],
                include_stop_in_output=include,
            ),
        )
        responses = await collect(stub, request)
        assert [t.token_id for t in tokens(responses)] == greedy[: cut + 1 if include else cut]
        done = finished(responses)[0]
        assert done.reason == pb.FINISH_REASON_STOP and done.stop_match.stop_token_id == stop
        assert responses[-1].usage.completion_tokens == cut + 1


async def test_stop_string_cuts_the_text(stub: pb.OpenEngineStub, reference: Reference) -> None:
    plain = await collect(stub, generate_request("plain", prompt="hello", sampling=GREEDY, stopping=no_eos(24)))
    full = text(plain)
    match = re.search(r"[a-z]{2,}", full[1:])
    assert match is not None, f"the greedy text {full!r} has no word to stop at"
    stop = match.group()
    for include in (False, True):
        request = generate_request(
            f"stop-text-{include}",
            prompt="hello",
            sampling=GREEDY,
            stopping=pb.StoppingOptions(
                max_tokens=24,
                ignore_eos=True,
                conditions=[pb.StopCondition(stop_text=stop)],
                include_stop_in_output=include,
            ),
        )
        responses = await collect(stub, request)
        end = full.index(stop) + (len(stop) if include else 0)
        assert text(responses) == full[:end]
        assert finished(responses)[0].stop_match.stop_text == stop


async def test_seeded_sampling_with_several_outputs_is_reproducible(stub: pb.OpenEngineStub) -> None:
    def request(request_id: str) -> pb.GenerateRequest:
        return generate_request(
            request_id,
            prompt=PROMPT,
            sampling=pb.SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=1234, num_sequences=3),
            stopping=no_eos(10),
        )

    first, second = await collect(stub, request("seed-1")), await collect(stub, request("seed-2"))
    assert set(finished(first)) == {0, 1, 2}
    assert [[t.token_id for t in tokens(first, i)] for i in range(3)] == [
        [t.token_id for t in tokens(second, i)] for i in range(3)
    ]
    assert first[-1].usage.completion_tokens == 30


async def test_min_tokens_and_penalties_are_accepted(stub: pb.OpenEngineStub) -> None:
    request = generate_request(
        "penalties",
        prompt=PROMPT,
        sampling=pb.SamplingParams(
            temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, min_p=0.05
        ),
        stopping=pb.StoppingOptions(max_tokens=6, min_tokens=6),
    )
    assert len(tokens(await collect(stub, request))) == 6


@pytest.mark.parametrize(
    ("guide", "pattern"),
    [
        (pb.GuidedDecoding(regex="(ab|ba){2}c"), r"(ab|ba){2}c"),
        (pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["alpha", "beta"])), r"alpha|beta"),
        (pb.GuidedDecoding(ebnf_grammar='root ::= "x" ("y" | "z")'), r"x[yz]"),
        (
            pb.GuidedDecoding(
                json_schema='{"type": "object", "properties": {"ok": {"type": "boolean"}}, '
                '"required": ["ok"], "additionalProperties": false}'
            ),
            r'\{\s*"ok"\s*:\s*(true|false)\s*\}',
        ),
    ],
    ids=["regex", "choice", "ebnf", "json_schema"],
)
async def test_guided_decoding_constrains_the_text(
    stub: pb.OpenEngineStub, guide: pb.GuidedDecoding, pattern: str
) -> None:
    request = generate_request(
        f"guided-{pattern[:8]}",
        prompt=PROMPT,
        sampling=GREEDY,
        stopping=pb.StoppingOptions(max_tokens=40),
        guided=guide,
    )
    responses = await collect(stub, request)
    assert re.fullmatch(pattern, text(responses)), text(responses)
    assert finished(responses)[0].stop_match.HasField("eos_token_id")


async def test_a_grammar_vllm_accepts_but_cannot_compile_is_a_final_invalid_argument(
    stub: pb.OpenEngineStub, reference: Reference
) -> None:
    """xgrammar rejects this grammar, vLLM's fallback parser accepts it, and the engine's grammar
    backend (xgrammar, fixed by its first guided request) fails it in the scheduler."""
    budget = pb.StoppingOptions(max_tokens=4)  # not no_eos: a guide with ignore_eos is refused up front
    regex = generate_request("xgrammar-first", prompt=PROMPT, stopping=budget, guided=pb.GuidedDecoding(regex="ab"))
    await collect(stub, regex)
    request = generate_request(
        "uncompilable", prompt=PROMPT, stopping=budget, guided=pb.GuidedDecoding(ebnf_grammar="root ::= ")
    )
    responses = await collect(stub, request)
    assert [r.WhichOneof("event") for r in responses] == ["error"]
    error = responses[-1].error
    assert error.code == pb.ERROR_CODE_INVALID_ARGUMENT and not error.retryable, error
    assert responses[-1].usage.prompt_tokens == len(reference.encode(PROMPT))  # the prompt still counts


async def test_a_guide_allowing_only_a_token_min_tokens_bans_is_a_final_invalid_argument(
    stub: pb.OpenEngineStub, reference: Reference
) -> None:
    """After "n" the choice allows only "o", a stop token ``min_tokens`` still bans: vLLM samples outside
    the grammar and fails the output. The caller's conflict, not worth a retry; only "n" was generated."""
    o = reference.tokenizer.convert_tokens_to_ids("o")
    request = generate_request(
        "guide-vs-min-tokens",
        prompt=PROMPT,
        sampling=GREEDY,
        stopping=pb.StoppingOptions(max_tokens=10, min_tokens=5, conditions=[pb.StopCondition(stop_token_id=o)]),
        guided=pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["no"])),
    )
    responses = await collect(stub, request)
    assert text(responses) == "n"
    error = responses[-1].error
    assert error.code == pb.ERROR_CODE_INVALID_ARGUMENT and not error.retryable, error
    assert responses[-1].usage.completion_tokens == 1


async def test_priority_and_cache_options_run(stub: pb.OpenEngineStub) -> None:
    request = generate_request(
        "options",
        prompt=PROMPT,
        priority=10,
        stopping=no_eos(2),
        kv=pb.KvOptions(cache_salt="tenant", bypass_prefix_cache=True, data_parallel_rank=0),
    )
    assert finished(await collect(stub, request))[0].reason == pb.FINISH_REASON_LENGTH
