"""The mock behind a real in-process gRPC gateway, end to end (one and two gateways)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends


@contextlib.asynccontextmanager
async def gateway(**options: Any) -> AsyncIterator[RunningGateway]:
    async with serve_backends([("mock", MockBackend(MockSettings(**options)))]) as running:
        yield running


async def collect(running: RunningGateway, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [response async for response in running.stub.Generate(request)]


async def test_generate_streams_every_output_with_usage_last() -> None:
    async with gateway() as running:
        responses = await collect(
            running,
            pb.GenerateRequest(
                request_id="r",
                model="mock",
                prompt="Hello",
                sampling=pb.SamplingParams(num_sequences=2, seed=1),
                stopping=pb.StoppingOptions(max_tokens=8),
                response=pb.ResponseOptions(return_prompt_logprobs=True, return_output_logprobs=True),
            ),
        )
    assert responses[0].WhichOneof("event") == "prompt" and not responses[0].prompt.tokens[0].HasField("logprob")
    tokens = [r.token for r in responses if r.WhichOneof("event") == "token"]
    assert {t.output_index for t in tokens} == {0, 1} and all(t.HasField("output_index") for t in tokens)
    assert all(info.HasField("logprob") and info.rank >= 1 for t in tokens for info in t.tokens)
    finished = [r for r in responses if r.WhichOneof("event") == "finished"]
    assert len(finished) == 2 and finished[-1] is responses[-1]
    usage = responses[-1].usage
    assert usage.prompt_tokens == 6 and usage.completion_tokens == sum(len(t.tokens) for t in tokens)
    assert usage.HasField("cached_prompt_tokens")


async def test_disabled_capabilities_are_rejected_before_acceptance() -> None:
    async with gateway(guided_decoding_modes=(), enable_lora=False, enable_embed=False) as running:
        with pytest.raises(grpc.aio.AioRpcError) as guided:
            await collect(
                running,
                pb.GenerateRequest(model="mock", prompt="x", guided=pb.GuidedDecoding(regex="[a-z]+")),
            )
        with pytest.raises(grpc.aio.AioRpcError) as lora:
            await running.stub.LoadLora(
                pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=1, lora_name="a", source_path="/tmp"))
            )
        with pytest.raises(grpc.aio.AioRpcError) as embed:
            await running.stub.Embed(
                pb.EmbedRequest(
                    context=pb.TaskRequestContext(request_id="e", model="mock"),
                    inputs=[pb.TaskInput(item_id="i", text="x")],
                )
            )
    assert guided.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert lora.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert embed.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_guided_choice_and_lora_over_grpc(tmp_path: Path) -> None:
    async with gateway() as running:
        await running.stub.LoadLora(
            pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=1, lora_name="a", source_path=str(tmp_path)))
        )
        responses = await collect(
            running,
            pb.GenerateRequest(
                model="mock",
                prompt="Pick one:",
                lora_name="a",
                guided=pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["left", "right"])),
            ),
        )
    text = "".join(r.token.text for r in responses if r.WhichOneof("event") == "token")
    assert text in ("left", "right")
    assert responses[-1].finished.stop_match.eos_token_id == 257


async def test_abort_cancels_and_frees_the_engine() -> None:
    async with gateway(decode_time_per_step_s=0.01) as running:
        call = running.stub.Generate(
            pb.GenerateRequest(
                request_id="long",
                model="mock",
                prompt="x",
                stopping=pb.StoppingOptions(max_tokens=500, ignore_eos=True),
            )
        )
        first = await anext(aiter(call))
        aborted = await running.stub.Abort(pb.AbortRequest(request_id="long"))
        rest = [response async for response in call]
        for _ in range(100):  # the driver's abort runs in the background
            load = await running.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
            if load.used_kv_blocks == 0:
                break
            await asyncio.sleep(0.01)
    assert first.WhichOneof("event") == "token" and aborted.status == pb.ABORT_STATUS_ABORTED
    assert rest[-1].finished.reason == pb.FINISH_REASON_CANCELLED
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)
    assert load.total_kv_blocks == 1024 and len(load.ranks) == 1


async def test_kv_events_reach_subscribers_with_sequence_numbers() -> None:
    async with gateway() as running:
        subscription = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True))
        stream = aiter(subscription)
        snapshot = (await asyncio.wait_for(anext(stream), 5)).batch  # the subscription is live from here
        assert (snapshot.sequence_number, len(snapshot.events)) == (0, 0)
        await collect(
            running, pb.GenerateRequest(model="mock", prompt="y" * 40, stopping=pb.StoppingOptions(max_tokens=1))
        )
        batch = (await asyncio.wait_for(anext(stream), 5)).batch
        subscription.cancel()
    assert batch.sequence_number == 1
    stored = batch.events[0].block_stored
    assert len(stored.block_hashes) == 2 and stored.block_size == 16 and stored.medium == pb.STORAGE_MEDIUM_GPU


async def test_prefill_and_decode_gateways_hand_off_kv() -> None:
    async with gateway(role="prefill") as prefill, gateway(role="decode") as decode, gateway() as aggregated:
        request = pb.GenerateRequest(
            model="mock",
            prompt="Split serving across two gateways.",
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingOptions(max_tokens=12, ignore_eos=True),
        )
        (ready,) = await collect(prefill, request)
        assert ready.WhichOneof("event") == "prefill_ready" and ready.usage.prompt_tokens == 35
        session = ready.prefill_ready.kv_session
        connector = await prefill.stub.GetKvConnectorInfo(pb.GetKvConnectorInfoRequest())
        assert session.endpoints[0].port == connector.local_endpoints[0].port
        assert (await prefill.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 1
        decode_request = pb.GenerateRequest()
        decode_request.CopyFrom(request)
        decode_request.kv.session.CopyFrom(session)
        decoded = await collect(decode, decode_request)
        local = await collect(aggregated, request)
        assert (await prefill.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 0
        again = await collect(decode, decode_request)
        # the Health probes of both roles
        for running, role in ((prefill, pb.ENGINE_ROLE_PREFILL), (decode, pb.ENGINE_ROLE_DECODE)):
            health = await running.stub.Health(pb.HealthRequest(include_inference_probe=True, role=role))
            assert health.state == pb.HEALTH_STATE_READY, health
        assert (await prefill.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 0

    def token_ids(responses: list[pb.GenerateResponse]) -> list[int]:
        return [t.token_id for r in responses if r.WhichOneof("event") == "token" for t in r.token.tokens]

    assert token_ids(decoded) == token_ids(local)
    assert decoded[-1].usage.cached_prompt_tokens == 32
    assert again[-1].error.code == pb.ERROR_CODE_KV_SESSION_NOT_FOUND


async def test_kv_session_abort_over_grpc() -> None:
    async with gateway(role="prefill") as prefill:
        (ready,) = await collect(prefill, pb.GenerateRequest(model="mock", prompt="abort me"))
        session = ready.prefill_ready.kv_session
        aborted = await prefill.stub.Abort(pb.AbortRequest(kv_session=session))
        again = await prefill.stub.Abort(pb.AbortRequest(kv_session=session))  # idempotent, as for requests
        load = await prefill.stub.GetLoad(pb.GetLoadRequest())
    assert (aborted.status, again.status) == (pb.ABORT_STATUS_ABORTED, pb.ABORT_STATUS_ALREADY_FINISHED)
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)
