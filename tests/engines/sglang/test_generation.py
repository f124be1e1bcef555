"""Generation through the gateway on real SGLang, checked against the same engine called directly."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("sglang")

from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway

from tests.engines.streams import free_port, generate_request
from tests.responses import collect, finished, text, tokens

from .conftest import engine_of, start

pytestmark = pytest.mark.sglang

PROMPT = "the quick brown fox jumps over"
GREEDY = pb.SamplingParams(temperature=0.0)
TOLERANCE = 2e-2
"""Logprobs of the same engine in different batches differ by kernel rounding only."""


@pytest.fixture(scope="module")
async def running(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    kv_events = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv"}
    async with start(tiny_model, kv_events_config=json.dumps(kv_events), enable_priority_scheduling=True) as gateway:
        yield gateway


def prompt_ids(running: RunningGateway, prompt: str = PROMPT) -> list[int]:
    tokenizer = engine_of(running).tokenizer_manager.tokenizer
    return list(tokenizer(prompt)["input_ids"])


async def native(running: RunningGateway, **kwargs: Any) -> dict[str, Any]:
    """SGLang's own answer to the same request (non-streamed)."""
    result: dict[str, Any] = await engine_of(running).async_generate(**kwargs)
    return result


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token_ids"])
async def test_greedy_ids_and_logprobs_equal_sglangs_own(running: RunningGateway, as_ids: bool) -> None:
    ids = prompt_ids(running)
    request = generate_request(
        f"greedy-{as_ids}",
        prompt=ids if as_ids else PROMPT,
        sampling=GREEDY,
        stopping=pb.StoppingOptions(max_tokens=16, ignore_eos=True),
        response=pb.ResponseOptions(
            return_output_logprobs=True,
            output_candidates=pb.CandidateTokenSelection(top_n=3),
            return_prompt_logprobs=True,
        ),
    )
    responses = await collect(running.stub, request)
    reference = await native(
        running,
        input_ids=ids,
        sampling_params={"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True},
        return_logprob=True,
        top_logprobs_num=3,
        logprob_start_len=0,
    )
    got = tokens(responses)
    assert [t.token_id for t in got] == reference["output_ids"]
    meta = reference["meta_info"]
    for token, (logprob, token_id, _), top in zip(
        got, meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert token.token_id == token_id and token.logprob == pytest.approx(logprob, abs=TOLERANCE)
        assert [c.token_id for c in token.candidates] == [entry[1] for entry in top]
        assert [c.rank for c in token.candidates] == [1, 2, 3]
    (prompt,) = [r.prompt for r in responses if r.HasField("prompt")]
    assert [t.token_id for t in prompt.tokens] == ids
    assert not prompt.tokens[0].HasField("logprob")
    for token, (logprob, _, _) in zip(prompt.tokens[1:], meta["input_token_logprobs"][1:], strict=True):
        assert token.logprob == pytest.approx(logprob, abs=TOLERANCE)
    usage = responses[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), 16)
    assert text(responses) == reference["text"]


async def test_stop_tokens_stop_strings_and_eos(running: RunningGateway) -> None:
    base = generate_request("base", prompt=PROMPT, sampling=GREEDY, stopping=pb.StoppingOptions(max_tokens=16))
    greedy = await collect(running.stub, base)
    ids = [t.token_id for t in tokens(greedy)]
    stop_id = next(i for position, i in enumerate(ids) if position >= 2 and i not in ids[:position])
    stop = pb.StoppingOptions(max_tokens=16, conditions=[pb.StopCondition(stop_token_id=stop_id)])
    dropped = await collect(running.stub, generate_request("stop-id", prompt=PROMPT, sampling=GREEDY, stopping=stop))
    assert [t.token_id for t in tokens(dropped)] == ids[: ids.index(stop_id)]
    assert finished(dropped)[0].stop_match == pb.StopMatch(stop_token_id=stop_id)
    stop.include_stop_in_output = True
    kept = await collect(running.stub, generate_request("stop-id-kept", prompt=PROMPT, sampling=GREEDY, stopping=stop))
    assert [t.token_id for t in tokens(kept)] == ids[: ids.index(stop_id) + 1]
    full = text(greedy)
    needle = full[len(full) // 2 : len(full) // 2 + 3]
    if needle.strip():
        by_text = pb.StoppingOptions(max_tokens=16, conditions=[pb.StopCondition(stop_text=needle)])
        cut = await collect(
            running.stub, generate_request("stop-text", prompt=PROMPT, sampling=GREEDY, stopping=by_text)
        )
        assert text(cut) == full[: full.index(needle)]
        assert finished(cut)[0].stop_match.stop_text == needle


async def test_several_sampled_outputs_and_refused_seeds(running: RunningGateway) -> None:
    sampling = pb.SamplingParams(temperature=1.0, num_sequences=3)
    request = generate_request("n3", prompt=PROMPT, sampling=sampling, stopping=pb.StoppingOptions(max_tokens=8))
    responses = await collect(running.stub, request)
    assert sorted(finished(responses)) == [0, 1, 2]
    assert responses[-1].usage.completion_tokens == sum(len(tokens(responses, i)) for i in range(3))
    seeded = generate_request("seeded", prompt=PROMPT, sampling=pb.SamplingParams(seed=1))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(running.stub, seeded)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, "seeds need --enable-deterministic-inference"


async def test_guided_regex_and_json(running: RunningGateway) -> None:
    regex = pb.GuidedDecoding(regex="(yes|no)[0-9]{2}")
    responses = await collect(running.stub, generate_request("regex", prompt=PROMPT, sampling=GREEDY, guided=regex))
    assert re.fullmatch("(yes|no)[0-9]{2}", text(responses))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    guided = pb.GuidedDecoding(json_schema=json.dumps(schema))
    stopping = pb.StoppingOptions(max_tokens=64)
    responses = await collect(
        running.stub, generate_request("json", prompt=PROMPT, sampling=GREEDY, guided=guided, stopping=stopping)
    )
    assert isinstance(json.loads(text(responses))["a"], int)


async def test_abort_stops_sglangs_request(running: RunningGateway) -> None:
    long = pb.StoppingOptions(max_tokens=400, ignore_eos=True)
    call = running.stub.Generate(generate_request("long", prompt=PROMPT, sampling=GREEDY, stopping=long))
    async for response in call:
        if response.HasField("token"):
            break
    await running.stub.Abort(pb.AbortRequest(request_id="long"))
    rest = [r async for r in call]
    assert finished(rest)[0].reason == pb.FINISH_REASON_CANCELLED
    manager = engine_of(running).tokenizer_manager
    for _ in range(100):
        if not manager.rid_to_state:
            break
        await asyncio.sleep(0.05)
    assert not manager.rid_to_state


async def test_priority_load_health_and_kv_events(running: RunningGateway) -> None:
    events = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
    await collect(running.stub, generate_request("prio", prompt=PROMPT * 4, sampling=GREEDY, priority=3))
    batch = await asyncio.wait_for(events.read(), 30)
    events.cancel()
    assert any(event.HasField("block_stored") for event in batch.batch.events)
    load = await running.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
    assert load.HasField("running_requests") and load.total_kv_blocks > 0
    health = await running.stub.Health(pb.HealthRequest(include_inference_probe=True))
    assert health.state == pb.HEALTH_STATE_READY


async def test_label_token_and_native_scores_equal_sglangs(running: RunningGateway) -> None:
    group = pb.ScoreGroup(
        group_id="g",
        query=pb.TaskInput(item_id="q", text="the quick brown"),
        candidates=[pb.TaskInput(item_id="a", text=" fox"), pb.TaskInput(item_id="b", text=" dog")],
    )
    labels = prompt_ids(running, " fox")[-1:] + prompt_ids(running, " dog")[-1:]
    context = pb.TaskRequestContext(request_id="score", model="tiny")
    options = pb.ScoreOptions(label_token_ids=labels)
    scored = await running.stub.Score(pb.ScoreRequest(context=context, groups=[group], options=options))
    reference = await engine_of(running).async_score(
        query="the quick brown", items=[" fox", " dog"], label_token_ids=labels
    )
    for candidate, row in zip(scored.groups[0].candidates, reference.scores, strict=True):
        assert list(candidate.scores.values) == pytest.approx(row, abs=TOLERANCE)
    native_context = pb.TaskRequestContext(request_id="native", model="tiny")
    likelihoods = await running.stub.Score(pb.ScoreRequest(context=native_context, groups=[group]))
    assert likelihoods.semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
    assert all(c.scores.values[0] < 0 for c in likelihoods.groups[0].candidates)
