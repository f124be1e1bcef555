"""Generation through the gateway on real TensorRT-LLM, checked against the engine's own results."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import grpc
import pytest

pytest.importorskip("tensorrt_llm")

from openengine_backends.trtllm.sampling import TORCH_SAMPLER_KNOBS
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect, finished, text, tokens

from .conftest import TOKENS_PER_BLOCK

pytestmark = pytest.mark.trtllm

PROMPT = "the quick brown fox jumps over"
GREEDY = pb.SamplingParams(temperature=0.0)


def no_eos(max_tokens: int, **fields: Any) -> pb.StoppingOptions:
    return pb.StoppingOptions(max_tokens=max_tokens, ignore_eos=True, **fields)


async def own(llm: Any, prompt_ids: list[int], **params: Any) -> Any:
    """TensorRT-LLM's own, non-streamed result for the same request."""
    from tensorrt_llm import SamplingParams

    return await llm.generate_async({"prompt_token_ids": prompt_ids}, sampling_params=SamplingParams(**params))


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token_ids"])
async def test_streamed_deltas_add_up_to_tensorrt_llms_own_greedy_result(
    stub: pb.OpenEngineStub, llm: Any, as_ids: bool
) -> None:
    prompt_ids = llm.tokenizer.encode(PROMPT)
    request = generate_request(
        f"greedy-{as_ids}",
        prompt=prompt_ids if as_ids else PROMPT,
        sampling=GREEDY,
        stopping=no_eos(24),
        response=pb.ResponseOptions(return_output_logprobs=True, output_candidates=pb.CandidateTokenSelection(top_n=3)),
    )
    responses = await collect(stub, request)
    reference = (await own(llm, prompt_ids, temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)).outputs[0]
    records = tokens(responses)
    assert [t.token_id for t in records] == reference.token_ids
    assert text(responses) == reference.text
    for record, row in zip(records, reference.logprobs, strict=True):
        assert record.logprob == pytest.approx(row[record.token_id].logprob, abs=1e-6)
        assert [c.token_id for c in record.candidates] == sorted(row, key=lambda t: row[t].rank)[:3]
    assert responses[-1].usage.prompt_tokens == len(prompt_ids)
    assert finished(responses)[0].reason == pb.FINISH_REASON_LENGTH


async def test_stop_tokens_and_strings(stub: pb.OpenEngineStub, llm: Any) -> None:
    prompt_ids = llm.tokenizer.encode(PROMPT)
    greedy = (await own(llm, prompt_ids, temperature=0.0, max_tokens=16, ignore_eos=True)).outputs[0]
    stop_id = next(
        t for position, t in enumerate(greedy.token_ids) if position >= 3 and t not in greedy.token_ids[:position]
    )
    position = greedy.token_ids.index(stop_id)
    by_token = await collect(
        stub,
        generate_request(
            "stop-token",
            prompt=PROMPT,
            sampling=GREEDY,
            stopping=no_eos(16, conditions=[pb.StopCondition(stop_token_id=stop_id)]),
        ),
    )
    assert [t.token_id for t in tokens(by_token)] == greedy.token_ids[:position]
    assert finished(by_token)[0].stop_match.stop_token_id == stop_id
    stop_text = greedy.text[4:6]
    by_text = await collect(
        stub,
        generate_request(
            "stop-text",
            prompt=PROMPT,
            sampling=GREEDY,
            stopping=no_eos(16, conditions=[pb.StopCondition(stop_text=stop_text)]),
        ),
    )
    assert text(by_text) == greedy.text[: greedy.text.find(stop_text)]
    assert finished(by_text)[0].stop_match.stop_text == stop_text


@pytest.mark.parametrize(
    "knob",
    [{"seed": 7}, {"min_p": 0.1}, {"repetition_penalty": 1.2}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}],
    ids=lambda knob: next(iter(knob)),
)
async def test_knobs_the_torch_sampler_ignores_are_refused(stub: pb.OpenEngineStub, knob: dict[str, float]) -> None:
    """The session's engine samples with TorchSampler (the default), which applies none of these."""
    sampling = pb.SamplingParams(temperature=1.0, **knob)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await collect(stub, generate_request("knob", prompt=PROMPT, sampling=sampling, stopping=no_eos(4)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and next(iter(knob)) in refused.value.details()


async def test_a_request_without_knobs_gets_the_neutral_sampling_defaults(
    gateway: RunningGateway, stub: pb.OpenEngineStub
) -> None:
    """TensorRT-LLM alone decodes greedily; the driver sets temperature 1, top_p 1, top_k off, as vLLM and SGLang
    sample (the tiny model's generation config, written by ``save_pretrained``, sets no sampling default)."""
    features = gateway.gateway.engines.engine(MODEL).backend._features  # type: ignore[attr-defined]
    assert dict(features.sampling.values) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert features.sampler_knobs == TORCH_SAMPLER_KNOBS and not features.sampling.dropped
    responses = await collect(stub, generate_request("free", prompt=PROMPT, stopping=no_eos(8)))
    assert finished(responses)[0].reason == pb.FINISH_REASON_LENGTH


@pytest.mark.parametrize(
    ("guide", "check"),
    [
        (pb.GuidedDecoding(regex="(ab|ba){2}c"), lambda s: re.fullmatch("(ab|ba){2}c", s)),
        (pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["alpha", "be.ta"])), lambda s: s in ("alpha", "be.ta")),
        (
            pb.GuidedDecoding(json_schema=json.dumps({"type": "string", "enum": ["yes", "no"]})),
            lambda s: json.loads(s) in ("yes", "no"),
        ),
    ],
    ids=["regex", "choice", "json_schema"],
)
async def test_guidance_constrains_the_output(stub: pb.OpenEngineStub, guide: pb.GuidedDecoding, check: Any) -> None:
    request = generate_request("guided", prompt=PROMPT, sampling=GREEDY, stopping=pb.StoppingOptions(max_tokens=32))
    request.guided.CopyFrom(guide)
    responses = await collect(stub, request)
    assert finished(responses)[0].reason == pb.FINISH_REASON_STOP
    assert check(text(responses))


async def test_cache_salt_and_the_prefix_cache(stub: pb.OpenEngineStub) -> None:
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)
    cached = []
    for position, salt in enumerate((None, None, "tenant")):
        request = generate_request(f"salted-{position}", prompt=prompt, sampling=GREEDY, stopping=no_eos(2))
        if salt is not None:
            request.kv.cache_salt = salt
        cached.append((await collect(stub, request))[-1].usage.cached_prompt_tokens)
    assert cached[0] == 0 and cached[1] >= TOKENS_PER_BLOCK and cached[2] == 0


async def test_kv_events_announce_full_blocks_only(stub: pb.OpenEngineStub) -> None:
    subscription = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
    prompt = " ".join(["pack my box with five dozen liquor jugs"] * 10)
    await collect(stub, generate_request("kv-events", prompt=prompt, sampling=GREEDY, stopping=no_eos(4)))
    batch = (await asyncio.wait_for(subscription.read(), 30)).batch
    subscription.cancel()
    stored = [e.block_stored for e in batch.events if e.HasField("block_stored")]
    assert stored and all(s.block_size == TOKENS_PER_BLOCK for s in stored)
    assert all(len(s.token_ids) == TOKENS_PER_BLOCK * len(s.block_hashes) for s in stored)
    assert all(h.encoding == "int64" and len(h.value) == 8 for s in stored for h in s.block_hashes)


async def test_abort_and_load(stub: pb.OpenEngineStub) -> None:
    call = stub.Generate(generate_request("long", prompt=PROMPT, sampling=GREEDY, stopping=no_eos(400)))
    assert (await call.read()).HasField("token")
    busy = await stub.GetLoad(pb.GetLoadRequest())
    assert (await stub.Abort(pb.AbortRequest(request_id="long"))).status == pb.ABORT_STATUS_ABORTED
    rest = []
    while (response := await call.read()) is not grpc.aio.EOF:
        rest.append(response)
    assert finished(rest)[0].reason == pb.FINISH_REASON_CANCELLED
    assert busy.running_requests >= 1 and busy.total_kv_blocks > 0
    health = await stub.Health(pb.HealthRequest(include_inference_probe=True))
    assert health.state == pb.HEALTH_STATE_READY
