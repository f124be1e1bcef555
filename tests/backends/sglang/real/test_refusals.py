"""What the driver refuses before acceptance, SGLang's own code refuses (or ignores) after it.

Each test shows the driver's ``InvalidArgument`` and, for the same request built by hand the way
the driver would have sent it, SGLang's ``ValueError`` from its real tokenizer manager or
``SamplingParams`` (which the driver would otherwise report as a failure after acceptance).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, mapping
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import CandidateSelection, GenerationRequest, LogprobRequest, Sampling, Stopping

from .admission import admit, plan, submitted

PROMPT = [5, 6, 7, 8]
IDS = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS


@pytest.fixture(scope="module")
def limits(tokenizer_manager: Any, internal_state: dict[str, Any]) -> mapping.EngineLimits:
    return capabilities.engine_limits(capabilities.engine_state(tokenizer_manager, internal_state))


def request(**fields: Any) -> GenerationRequest:
    fields.setdefault("prompt_token_ids", PROMPT)
    return GenerationRequest(request_id="r", model="tiny", **fields)


def fields_of(manager: Any, limits: mapping.EngineLimits, **fields: Any) -> dict[str, Any]:
    """The ``GenerateReqInput`` fields of an accepted request's output 0, to alter by hand."""
    generation, _ = plan(manager, request(**fields), limits)
    return dict(submitted(generation, "r")[0])


def with_sampling(fields: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {**fields, "sampling_params": {**fields["sampling_params"], **values}}


async def test_a_repetition_penalty_above_two(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    with pytest.raises(InvalidArgument, match="repetition_penalty"):
        plan(tokenizer_manager, request(sampling=Sampling(repetition_penalty=2.5)), limits)
    accepted = fields_of(tokenizer_manager, limits, sampling=Sampling(repetition_penalty=2.0))
    await admit(tokenizer_manager, accepted)
    with pytest.raises(ValueError, match="repetition_penalty"):
        await admit(tokenizer_manager, with_sampling(accepted, repetition_penalty=2.5))


async def test_more_stop_strings_than_sglang_takes(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    from sglang.srt.sampling.sampling_params import MAX_STOP_COUNT

    assert mapping.MAX_STOP_STRINGS == MAX_STOP_COUNT
    texts = tuple(f"s{i}" for i in range(MAX_STOP_COUNT + 1))
    with pytest.raises(InvalidArgument, match="stop strings"):
        plan(tokenizer_manager, request(stopping=Stopping(stop_texts=texts)), limits)
    accepted = fields_of(tokenizer_manager, limits, stopping=Stopping(stop_texts=texts[:-1]))
    await admit(tokenizer_manager, accepted)
    with pytest.raises(ValueError, match="stop strings"):
        await admit(tokenizer_manager, with_sampling(accepted, stop=list(texts)))


async def test_min_tokens_above_the_budget(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    with pytest.raises(InvalidArgument, match="min_tokens"):
        plan(tokenizer_manager, request(stopping=Stopping(max_tokens=4, min_tokens=5)), limits)
    accepted = fields_of(tokenizer_manager, limits, stopping=Stopping(max_tokens=4, min_tokens=4))
    await admit(tokenizer_manager, accepted)
    with pytest.raises(ValueError, match="min_new_tokens"):
        await admit(tokenizer_manager, with_sampling(accepted, min_new_tokens=5))


async def test_a_candidate_id_outside_the_vocabulary(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    vocab = limits.vocab_size
    outside = LogprobRequest(candidates=CandidateSelection(mode=IDS, token_ids=(vocab,)))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        plan(tokenizer_manager, request(output_logprobs=outside), limits)
    last = LogprobRequest(candidates=CandidateSelection(mode=IDS, token_ids=(vocab - 1,)))
    accepted = fields_of(tokenizer_manager, limits, output_logprobs=last)
    await admit(tokenizer_manager, accepted)
    with pytest.raises(ValueError, match="out-of-vocabulary"):
        await admit(tokenizer_manager, {**accepted, "token_ids_logprob": [vocab]})


async def test_a_stop_token_outside_the_vocabulary_would_be_ignored(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    """SGLang takes it and never stops on it; the driver says so instead."""
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        plan(tokenizer_manager, request(stopping=Stopping(stop_token_ids=(limits.vocab_size,))), limits)
    accepted = fields_of(tokenizer_manager, limits)
    tokenized = await admit(tokenizer_manager, with_sampling(accepted, stop_token_ids=[limits.vocab_size]))
    assert tokenized.sampling_params.stop_token_ids == {limits.vocab_size}


async def test_a_prompt_as_long_as_the_context(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    prompt = [3] * tokenizer_manager.context_len
    with pytest.raises(InvalidArgument, match="at most"):
        plan(tokenizer_manager, request(prompt_token_ids=prompt), limits)
    accepted = fields_of(tokenizer_manager, limits, stopping=Stopping(max_tokens=1))
    with pytest.raises(ValueError, match="longer than the model's context length"):
        await admit(tokenizer_manager, {**accepted, "input_ids": prompt})


async def test_an_output_budget_past_the_context(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    """Past the driver's limit SGLang's scheduler would shorten the output silently
    (``max_req_len - prompt - 1``, ``Scheduler.init_req_max_new_tokens``); past the context
    its tokenizer manager refuses."""
    room = limits.max_context - len(PROMPT)
    with pytest.raises(InvalidArgument, match="exceeds the context"):
        plan(tokenizer_manager, request(stopping=Stopping(max_tokens=room + 1)), limits)
    accepted = fields_of(tokenizer_manager, limits, stopping=Stopping(max_tokens=room))
    past = tokenizer_manager.context_len - len(PROMPT) + 1
    with pytest.raises(ValueError, match="exceeds the model's maximum context length"):
        await admit(tokenizer_manager, with_sampling(accepted, max_new_tokens=past))


@pytest.mark.parametrize("stopping", [Stopping(stop_texts=("x",)), Stopping(min_tokens=1)])
def test_without_a_tokenizer(limits: mapping.EngineLimits, stopping: Stopping) -> None:
    """Under ``--skip-tokenizer-init`` SGLang normalises with no tokenizer
    (``sampling_params.raise_if_tokenizer_required``)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    untokenized = replace(limits, has_tokenizer=False)
    with pytest.raises(InvalidArgument, match="without a tokenizer"):
        mapping.plan_generation(request(stopping=stopping), untokenized, input_ids=PROMPT)
    allowed = mapping.plan_generation(request(stopping=Stopping(stop_token_ids=(9,))), untokenized, input_ids=PROMPT)
    params = SamplingParams(**allowed.outputs[0]["sampling_params"])
    params.normalize(None)
    params.verify(limits.vocab_size)
    sent = mapping.plan_generation(request(stopping=stopping), limits, input_ids=PROMPT)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        SamplingParams(**sent.outputs[0]["sampling_params"]).normalize(None)


async def test_a_data_parallel_rank_the_engine_lacks(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    """Rank 0 of a one-rank engine is admitted (and ignored); the gateway refuses others before the driver."""
    accepted = fields_of(tokenizer_manager, limits, data_parallel_rank=0)
    await admit(tokenizer_manager, accepted)
    with pytest.raises(ValueError, match="routed_dp_rank=1 out of range"):
        await admit(tokenizer_manager, {**accepted, "routed_dp_rank": 1})


def test_stop_strings_with_min_tokens(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    """SGLang's scheduler matches stop strings from the first token (``Req.update_finish_state``,
    ``_check_str_based_finish``); ``min_new_tokens`` holds back only stop tokens and EOS
    (``sampling/penaltylib/min_new_tokens.py``). vLLM, and the TensorRT-LLM driver's own matcher,
    check stop strings from ``min_tokens`` on, so the driver refuses the combination."""
    from array import array

    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_STR, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    stopping = Stopping(min_tokens=8, stop_texts=("dog",))
    with pytest.raises(InvalidArgument, match="stop strings from the first token"):
        plan(tokenizer_manager, request(stopping=stopping), limits)
    plan(tokenizer_manager, request(stopping=Stopping(min_tokens=8, stop_token_ids=(9,))), limits)
    plan(tokenizer_manager, request(stopping=Stopping(stop_texts=("dog",))), limits)

    sent = mapping.plan_generation(request(stopping=Stopping(max_tokens=20)), limits, input_ids=PROMPT)
    params = SamplingParams(**{**sent.outputs[0]["sampling_params"], "min_new_tokens": 8, "stop": ["dog"]})
    params.normalize(tokenizer_manager.tokenizer)
    params.verify(limits.vocab_size)
    req = Req(
        "r", "", array("q", PROMPT), params, eos_token_ids=set(limits.eos_token_ids), vocab_size=limits.vocab_size
    )
    req.tokenizer = tokenizer_manager.tokenizer
    for token in tokenizer_manager.tokenizer.encode(" the lazy dog jumps over", add_special_tokens=False):
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished_reason is not None:
            break
    assert isinstance(req.finished_reason, FINISH_MATCHED_STR)
    assert len(req.output_ids) < 8, "SGLang ended the output on the stop string inside min_new_tokens"
