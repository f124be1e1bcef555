"""Failures after acceptance: one terminal EngineError, usage on the final response only, status OK."""

from __future__ import annotations

import asyncio

import grpc
from openengine_gateway import pb

from .conftest import serve


async def test_an_engine_failure_mid_stream_is_one_terminal_retryable_error() -> None:
    async with serve() as served:
        target = served.target
        request = target.long_request(num_sequences=3, return_output_logprobs=True)
        call = target.open_call(request)
        await call.first()
        served.backend.fail("simulated crash")
        stream = await call.rest()  # status OK: rest() raises on any other
        rejected = await target.expect_rejected(target.prompt(max_tokens=1), grpc.StatusCode.UNAVAILABLE, what="new")
        health = await served.client.health()
        served.backend.restart()
        for _ in range(100):  # the gateway's monitor notices the recovery
            if (await served.client.health()).state == pb.HEALTH_STATE_READY:
                break
            await asyncio.sleep(0.05)
        recovered = (await target.run(target.prompt(max_tokens=2))).succeeded()
    kinds = [m.WhichOneof("event") for m in stream.messages]
    assert kinds[-1] == "error" and kinds.count("error") == 1 and "finished" not in kinds
    error = stream.last.error
    assert error.code == pb.ERROR_CODE_INTERNAL and error.retryable and error.HasField("retry_after_ms")
    assert [m.HasField("usage") for m in stream.messages].count(True) == 1 and stream.last.HasField("usage")
    emitted = sum(len(stream.tokens(i)) for i in range(3))
    assert stream.usage.prompt_tokens == 45 and stream.usage.completion_tokens >= emitted
    assert rejected.retry_after_ms is not None and health.state == pb.HEALTH_STATE_NOT_READY
    assert recovered.finished().reason == pb.FINISH_REASON_LENGTH


async def test_usage_is_cumulative_and_only_on_the_final_response() -> None:
    async with serve() as served:
        request = served.target.prompt(max_tokens=5, ignore_eos=True, num_sequences=3, temperature=1.0, seed=3)
        request.response.return_prompt_logprobs = True
        stream = (await served.target.run(request)).succeeded()
    with_usage = [i for i, m in enumerate(stream.messages) if m.HasField("usage")]
    assert with_usage == [len(stream.messages) - 1] and stream.last.WhichOneof("event") == "finished"
    assert stream.messages[0].WhichOneof("event") == "prompt"
    usage = stream.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (45, 15, 60)
    assert {stream.finished(i).reason for i in range(3)} == {pb.FINISH_REASON_LENGTH}
