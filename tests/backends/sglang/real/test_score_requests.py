"""Causal-model Score requests as ``tasks.TaskRunner`` builds them, admitted by SGLang's real
``TokenizerManager`` for the tiny Llama's generation model."""

from __future__ import annotations

from typing import Any

import pytest
from openengine_backends.sglang import capabilities, tasks
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import ScoreCall, ScoreGroupCall, TaskContext, TaskItem

from .admission import answered, runner, sent_by


async def test_causal_scores_are_prefill_only_requests_from_the_querys_last_token(
    tokenizer_manager: Any, internal_state: dict[str, Any]
) -> None:
    group = ScoreGroupCall("g", query=TaskItem("q", text="the quick"), candidates=(TaskItem("c", text=" brown fox"),))
    call = ScoreCall(context=TaskContext(request_id="t", model="tiny"), groups=(group,))
    (tokenized,) = await sent_by(tokenizer_manager, runner(tokenizer_manager, internal_state).score(call, ["s0"]))
    tokenizer = tokenizer_manager.tokenizer
    query = tokenizer("the quick")["input_ids"]
    candidate = tokenizer(" brown fox", add_special_tokens=False)["input_ids"]
    assert list(tokenized.input_ids) == list(query) + list(candidate)
    assert tokenized.sampling_params.max_new_tokens == 0
    assert tokenized.return_logprob is True
    assert tokenized.logprob_start_len == len(query) - 1


async def test_a_causal_score_is_the_candidates_summed_prompt_logprobs(
    tokenizer_manager: Any, internal_state: dict[str, Any]
) -> None:
    """SGLang answers the prefill-only request with the prompt logprobs from ``logprob_start_len``,
    the first without a value; the score sums the candidate's."""
    from sglang.srt.managers.io_struct import BatchStrOutput
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    group = ScoreGroupCall("g", query=TaskItem("q", text="the quick"), candidates=(TaskItem("c", text=" brown fox"),))
    call = ScoreCall(context=TaskContext(request_id="t", model="tiny"), groups=(group,))

    def answer(tokenized: Any) -> Any:
        rows = list(tokenized.input_ids)[tokenized.logprob_start_len :]
        values = [None] + [-0.5] * (len(rows) - 1)
        return BatchStrOutput(
            rids=[tokenized.rid], finished_reasons=[FINISH_LENGTH(0).to_json()], output_strs=[""], output_ids=[[]],
            prompt_tokens=[len(tokenized.input_ids)], completion_tokens=[0], reasoning_tokens=[0], cached_tokens=[0],
            input_token_logprobs_val=[values], input_token_logprobs_idx=[rows],
            output_token_logprobs_val=[[]], output_token_logprobs_idx=[[]],
            input_top_logprobs_val=[], input_top_logprobs_idx=[], output_top_logprobs_val=[[]],
            output_top_logprobs_idx=[[]], input_token_ids_logprobs_val=[], input_token_ids_logprobs_idx=[],
            output_token_ids_logprobs_val=[[]], output_token_ids_logprobs_idx=[[]], output_token_entropy_val=None,
            output_token_sampling_mask=None, output_hidden_states=None, routed_experts=None, indexer_topk=None,
            placeholder_tokens_idx=None, placeholder_tokens_val=None, retraction_counts=[0],
        )  # fmt: skip

    work = runner(tokenizer_manager, internal_state).score(call, ["s1"])
    response, usage = await answered(tokenizer_manager, work, answer, 1)
    candidate = tokenizer_manager.tokenizer(" brown fox", add_special_tokens=False)["input_ids"]
    (scored,) = response.groups[0]
    assert list(scored.scores.values) == pytest.approx([-0.5 * len(candidate)])
    assert response.semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
    query = tokenizer_manager.tokenizer("the quick")["input_ids"]
    assert usage.input_tokens == len(query) + len(candidate)


async def test_label_ids_outside_the_tokenizers_vocabulary_are_refused_before_sglang(
    tokenizer_manager: Any, internal_state: dict[str, Any]
) -> None:
    """SGLang's ``score_request`` (``managers/tokenizer_manager_score_mixin.py``) refuses a label id
    from the tokenizer's ``vocab_size`` on, after acceptance; the driver refuses it before."""
    from functools import partial
    from types import SimpleNamespace

    from sglang.srt.entrypoints.engine_score_mixin import EngineScoreMixin
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput

    engine = SimpleNamespace(tokenizer_manager=tokenizer_manager)
    engine.async_score = partial(EngineScoreMixin.async_score, engine)
    outside = tokenizer_manager.tokenizer.vocab_size
    with pytest.raises(ValueError, match="out of vocabulary"):
        await engine.async_score(query="the", items=["fox"], label_token_ids=[3, outside], apply_softmax=False)
    state = capabilities.engine_state(tokenizer_manager, internal_state)
    limits = capabilities.engine_limits(state)
    driver = tasks.TaskRunner(engine, state, limits, EmbeddingReqInput, GenerateReqInput)
    group = ScoreGroupCall("g", query=TaskItem("q", text="the"), candidates=(TaskItem("c", text="fox"),))
    call = ScoreCall(context=TaskContext(request_id="t", model="tiny"), groups=(group,), label_token_ids=(3, outside))
    with pytest.raises(InvalidArgument, match=f"label_token_ids \\[{outside}\\] are outside"):
        await driver.score(call, ["s2"])
