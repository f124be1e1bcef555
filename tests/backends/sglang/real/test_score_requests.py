"""Causal-model Score requests as ``tasks.TaskRunner`` builds them, admitted by SGLang's real
``TokenizerManager`` for the tiny Llama's generation model."""

from __future__ import annotations

from typing import Any

from openengine_gateway.spi import ScoreCall, ScoreGroupCall, TaskContext, TaskItem

from .admission import runner, sent_by


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
