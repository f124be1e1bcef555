"""Generation through the gateway on the driver and the fake SGLang engine.

The fake continues a sequence of length ``L`` greedily with ``CYCLE[L % 13]`` ("hello world."
then EOS), so a three-token prompt continues "lo world." and ends on EOS.
"""

from __future__ import annotations

import asyncio
import math
import types

import grpc
import pytest
from openengine_gateway import pb

from tests.responses import collect, finished, text, tokens

from ..fake_serving import MODEL, serving
from . import fake_engine
from .conftest import GREEDY, request, sglang
from .fake_api import EOS


def received(index: int = -1) -> object:
    """The ``GenerateReqInput`` the fake's tokenizer manager got."""
    return fake_engine.ENGINES[0].tokenizer_manager.received[index]


async def test_greedy_text_ends_on_eos_with_usage(fake: types.ModuleType) -> None:
    async with serving(sglang()) as running:
        responses = await collect(running.stub, request("say", sampling=GREEDY))
    assert text(responses) == "lo world."
    assert [t.token_id for t in tokens(responses)] == [ord(c) for c in "lo world."] + [EOS]
    assert finished(responses)[0].stop_match == pb.StopMatch(eos_token_id=EOS)
    usage = responses[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (3, 10, 13)
    assert received().input_ids == [ord(c) for c in "say"], "text is tokenized by the driver, as SGLang would"
    max_req_len = 256 - 1  # SGLang's bound for a context of 256: its scheduler clips to max_req_len - input - 1
    assert received().sampling_params["max_new_tokens"] == max_req_len - 3 - 1, "the rest of the context, not 128"


async def test_token_id_prompts_and_a_length_finish(fake: types.ModuleType) -> None:
    async with serving(sglang()) as running:
        stopping = pb.StoppingOptions(max_tokens=4)
        responses = await collect(running.stub, request([104, 101, 108, 108], sampling=GREEDY, stopping=stopping))
    assert text(responses) == "o wo" and finished(responses)[0].reason == pb.FINISH_REASON_LENGTH


async def test_stop_strings_are_held_back_and_trimmed(fake: types.ModuleType) -> None:
    stop = pb.StoppingOptions(conditions=[pb.StopCondition(stop_text="wor")])
    async with serving(sglang()) as running:
        responses = await collect(running.stub, request("say", sampling=GREEDY, stopping=stop))
        stop.include_stop_in_output = True
        included = await collect(running.stub, request("say", sampling=GREEDY, stopping=stop))
    assert text(responses) == "lo " and finished(responses)[0].stop_match.stop_text == "wor"
    assert text(included) == "lo wor"


async def test_a_callers_stop_token_is_dropped_unless_included_and_told_from_eos(fake: types.ModuleType) -> None:
    stop = pb.StoppingOptions(conditions=[pb.StopCondition(stop_token_id=ord("w"))])
    async with serving(sglang()) as running:
        dropped = await collect(running.stub, request("say", sampling=GREEDY, stopping=stop))
        stop.include_stop_in_output = True
        kept = await collect(running.stub, request("say", sampling=GREEDY, stopping=stop))
        eos_by_name = pb.StoppingOptions(conditions=[pb.StopCondition(stop_token_id=EOS)])
        named = await collect(running.stub, request("say", sampling=GREEDY, stopping=eos_by_name))
    assert text(dropped) == "lo " and [t.token_id for t in tokens(dropped)][-1] == ord(" ")
    assert finished(dropped)[0].stop_match == pb.StopMatch(stop_token_id=ord("w"))
    assert dropped[-1].usage.completion_tokens == 4, "the stop token was generated"
    assert text(kept) == "lo w" and tokens(kept)[-1].token_id == ord("w")
    assert finished(named)[0].stop_match == pb.StopMatch(stop_token_id=EOS), "the caller named the EOS id"


async def test_with_ignore_eos_the_driver_stops_on_the_callers_token(fake: types.ModuleType) -> None:
    """SGLang's ``ignore_eos`` disables stop ids too; the driver ends the output and SGLang's request itself."""
    stop = pb.StoppingOptions(max_tokens=40, ignore_eos=True, conditions=[pb.StopCondition(stop_token_id=ord("r"))])
    async with serving(sglang()) as running:
        responses = await collect(running.stub, request("say", sampling=GREEDY, stopping=stop))
        sent = received()
        for _ in range(100):
            if not fake_engine.ENGINES[0].tokenizer_manager.rid_to_state:
                break
            await asyncio.sleep(0.01)
    assert text(responses) == "lo wo" and finished(responses)[0].stop_match == pb.StopMatch(stop_token_id=ord("r"))
    assert sent.sampling_params["ignore_eos"] and "stop_token_ids" not in sent.sampling_params
    assert not fake_engine.ENGINES[0].tokenizer_manager.rid_to_state, "SGLang's request was aborted"


async def test_output_and_prompt_logprobs_equal_the_models(fake: types.ModuleType) -> None:
    options = pb.ResponseOptions(
        return_output_logprobs=True,
        output_candidates=pb.CandidateTokenSelection(top_n=2),
        return_prompt_logprobs=True,
        prompt_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[97, 98])),
        prompt_logprob_start=1,
    )
    async with serving(sglang()) as running:
        responses = await collect(running.stub, request("say", sampling=GREEDY, response=options))
    got = tokens(responses)
    for position, token in enumerate(got):
        logprobs = fake_engine.distribution(3 + position)
        assert token.logprob == pytest.approx(logprobs[token.token_id]) and token.rank == 1
        assert [c.rank for c in token.candidates] == [1, 2]
        assert token.token == chr(token.token_id) if token.token_id != EOS else token.token == "</s>"
    (prompt,) = [r.prompt for r in responses if r.HasField("prompt")]
    assert [t.token_id for t in prompt.tokens] == [ord("a"), ord("y")], "from position 1 on"
    for position, token in enumerate(prompt.tokens, start=1):
        logprobs = fake_engine.distribution(position)
        assert token.logprob == pytest.approx(logprobs[token.token_id])
        assert [(c.token_id, c.HasField("rank")) for c in token.candidates] == [(97, False), (98, False)]
        assert token.candidates[0].logprob == pytest.approx(logprobs[97])
    assert received().logprob_start_len == 0 and received().top_logprobs_num == 2
    assert received().token_ids_logprob == [97, 98] and received().return_text_in_logprobs


async def test_all_candidates_cover_the_vocabulary(fake: types.ModuleType) -> None:
    options = pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(all=pb.AllCandidates()))
    async with serving(sglang()) as running:
        stopping = pb.StoppingOptions(max_tokens=1)
        responses = await collect(running.stub, request("say", sampling=GREEDY, stopping=stopping, response=options))
    (token,) = tokens(responses)
    assert len(token.candidates) == 128
    assert math.fsum(math.exp(c.logprob) for c in token.candidates) == pytest.approx(1.0)


async def test_several_outputs_run_as_seeded_sglang_requests(fake: types.ModuleType) -> None:
    sampling = pb.SamplingParams(temperature=1.0, seed=7, num_sequences=3)
    async with serving(sglang(enable_deterministic_inference=True)) as running:
        responses = await collect(
            running.stub, request("say", sampling=sampling, stopping=pb.StoppingOptions(max_tokens=5))
        )
    assert sorted(finished(responses)) == [0, 1, 2]
    requests = fake_engine.ENGINES[0].tokenizer_manager.received
    assert [r.sampling_params["sampling_seed"] for r in requests] == [7, 8, 9]
    assert len({r.rid for r in requests}) == 3
    assert responses[-1].usage.completion_tokens == sum(len(tokens(responses, i)) for i in range(3))


async def test_options_reach_sglang(fake: types.ModuleType) -> None:
    async with serving(sglang(enable_priority_scheduling=True)) as running:
        guided = pb.GuidedDecoding(json_object=pb.JsonObjectConstraint())
        kv = pb.KvOptions(cache_salt="tenant")
        sampling = pb.SamplingParams(temperature=0.0, top_k=0, min_p=0.2)
        await collect(running.stub, request("say", sampling=sampling, guided=guided, priority=5, kv=kv))
    sent = received()
    assert sent.priority == 5 and sent.cache_salt == "tenant"
    assert sent.sampling_params["json_schema"] == '{"type": "object"}'
    assert sent.sampling_params["top_k"] == -1 and sent.sampling_params["min_p"] == 0.2


async def test_what_sglang_cannot_do_is_refused_before_acceptance(fake: types.ModuleType) -> None:
    async with serving(sglang()) as running:
        for bad in (
            request(sampling=pb.SamplingParams(seed=1)),
            request(priority=1),
            request(kv=pb.KvOptions(bypass_prefix_cache=True)),
            request(stopping=pb.StoppingOptions(max_tokens=300)),
            request(sampling=pb.SamplingParams(repetition_penalty=3.0)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await collect(running.stub, bad)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fake_engine.ENGINES[0].tokenizer_manager.received == []


async def test_sglangs_own_rejection_after_acceptance_is_one_engine_error(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise ValueError("The input is longer than the model's context length")

    monkeypatch.setattr(fake_engine.TokenizerManager, "_validate", refuse)
    async with serving(sglang()) as running:
        responses = await collect(running.stub, request("say"))
    assert [r.WhichOneof("event") for r in responses] == ["error"]
    assert responses[0].error.code == pb.ERROR_CODE_INVALID_ARGUMENT


async def test_cached_prompt_tokens(fake: types.ModuleType) -> None:
    async with serving(sglang(page_size=2)) as running:
        await collect(running.stub, request("hello there", sampling=GREEDY))
        again = await collect(running.stub, request("hello world", sampling=GREEDY))
    assert again[-1].usage.cached_prompt_tokens == 6, "the common prefix 'hello ', in whole pages"


async def test_eagles_reserved_draft_slots_bound_what_is_advertised_and_accepted(fake: types.ModuleType) -> None:
    """SGLang counts EAGLE's draft tokens with every request's input (``num_reserved_tokens``)."""
    options = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 4}
    async with serving(sglang(context_length=64, **options)) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        longest, budget = 45, info.max_context_length - 45  # max_req_input_len 58 - 1 - 12 reserved
        stopping = pb.StoppingOptions(max_tokens=budget, ignore_eos=True)
        responses = await collect(running.stub, request([ord("a")] * longest, sampling=GREEDY, stopping=stopping))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(running.stub, request([ord("a")] * (longest + 1), sampling=GREEDY))
    assert fake_engine.ENGINES[0].tokenizer_manager.num_reserved_tokens == 12 and info.max_context_length == 50
    assert finished(responses)[0].reason == pb.FINISH_REASON_LENGTH
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("defaults", "sent"), [("model", {"temperature": 0.6, "top_p": 0.9, "top_k": 20}), ("openai", {})]
)
async def test_unset_knobs_take_the_generation_config_unless_sampling_defaults_is_openai(
    fake: types.ModuleType, defaults: str, sent: dict[str, float]
) -> None:
    """SGLang itself applies these only in chat; the driver applies them to every request, as vLLM's server."""
    async with serving(sglang("/models/fake-llm-tuned", sampling_defaults=defaults)) as running:
        await collect(running.stub, request(stopping=pb.StoppingOptions(max_tokens=2)))
    params = fake_engine.ENGINES[0].tokenizer_manager.received[-1].sampling_params
    assert {k: params[k] for k in ("temperature", "top_p", "top_k") if k in params} == sent
