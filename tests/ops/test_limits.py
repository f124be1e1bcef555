"""Operator limits over real gRPC: past each one RESOURCE_EXHAUSTED, with a retry hint only
where a retry can succeed (concurrency), never an unbounded queue."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.server.app import ServerOptions

from tests.ops.support import gateway, wait_until


def retry_after(error: grpc.aio.AioRpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get("retry-after-ms")  # type: ignore[arg-type]


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        if hasattr(call, "__aiter__"):
            async for _ in call:  # type: ignore[attr-defined]
                pass
        else:
            await call  # type: ignore[misc]
    return error.value


def generate(prompt: str | None = None, ids: list[int] | None = None, max_tokens: int = 2) -> pb.GenerateRequest:
    request = pb.GenerateRequest(model="mock", stopping=pb.StoppingOptions(max_tokens=max_tokens))
    if ids is not None:
        request.token_ids.ids.extend(ids)
    else:
        request.prompt = prompt or "x"
    return request


def task() -> pb.TaskRequestContext:
    return pb.TaskRequestContext(request_id="t", model="mock")


async def test_prompt_length_limits() -> None:
    options = GatewayOptions(max_prompt_chars=10, max_prompt_tokens=4)
    async with gateway(options=options) as running:
        stub = running.stub
        assert [r async for r in stub.Generate(generate("a" * 10))][-1].HasField("finished")
        assert [r async for r in stub.Generate(generate(ids=[1, 2, 3, 4]))][-1].HasField("finished")
        for request in (generate("a" * 11), generate(ids=[1, 2, 3, 4, 5])):
            error = await refused(stub.Generate(request))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most" in (error.details() or "")
            assert retry_after(error) is None  # the same request would be refused again
        embed = pb.EmbedRequest(context=task(), inputs=[pb.TaskInput(item_id="a", text="a" * 11)])
        assert (await refused(stub.Embed(embed))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_task_batch_limit() -> None:
    """Advertised as the tasks' limits (past one: INVALID_ARGUMENT, as for any advertised limit); a Score
    within its advertised limits but past the cap in all is the operator's refusal (RESOURCE_EXHAUSTED)."""
    async with gateway(options=GatewayOptions(max_task_items=5)) as running:
        stub = running.stub
        tasks = (await stub.GetModelInfo(pb.GetModelInfoRequest(model="mock"))).tasks  # what is admitted, advertised
        assert (tasks.embed.max_batch_size, tasks.classify.max_batch_size) == (5, 5)
        assert (tasks.score.max_groups, tasks.score.max_candidates_per_group) == (2, 4)
        inputs = [pb.TaskInput(item_id=str(i), text="x") for i in range(6)]
        await stub.Embed(pb.EmbedRequest(context=task(), inputs=inputs[:5]))
        assert (await refused(stub.Embed(pb.EmbedRequest(context=task(), inputs=inputs)))).code() == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert (await refused(stub.Classify(pb.ClassifyRequest(context=task(), inputs=inputs)))).code() == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        unknown = pb.EmbedRequest(context=task(), inputs=inputs)
        unknown.context.model = "nope"
        assert (await refused(stub.Embed(unknown))).code() == grpc.StatusCode.NOT_FOUND, "the model, before the cap"
        groups = [pb.ScoreGroup(group_id=f"g{g}", query=inputs[0], candidates=inputs[1:3]) for g in range(2)]
        error = await refused(stub.Score(pb.ScoreRequest(context=task(), groups=groups)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "6 task inputs" in (error.details() or "")


async def test_concurrent_requests_limit_carries_a_retry_hint() -> None:
    async with gateway(options=GatewayOptions(max_in_flight=2), decode_time_per_step_s=0.01) as running:
        stub = running.stub
        streams = [stub.Generate(generate(max_tokens=1000)) for _ in range(2)]
        for stream in streams:
            await stream.read()
        error = await refused(stub.Generate(generate()))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after(error) == "100"
        embed = pb.EmbedRequest(context=task(), inputs=[pb.TaskInput(item_id="a", text="x")])
        assert (await refused(stub.Embed(embed))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for stream in streams:
            stream.cancel()
        await wait_until(lambda: len(running.gateway.registry) == 0, what="the streams leave")
        assert [r async for r in stub.Generate(generate())][-1].HasField("finished")


async def test_concurrent_subscriptions_limit_carries_a_retry_hint() -> None:
    async with gateway(options=GatewayOptions(max_subscriptions=2)) as running:
        stub = running.stub
        kv = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True))
        await kv.read()
        runtime = stub.SubscribeRuntimeEvents(pb.SubscribeRuntimeEventsRequest())
        events = running.gateway.events
        await wait_until(lambda: events.kv.subscriber_count + events.runtime.subscriber_count == 2)
        for third in (
            stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest()),
            stub.SubscribeRuntimeEvents(pb.SubscribeRuntimeEventsRequest()),
        ):
            error = await refused(third)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after(error) == "1000"
        runtime.cancel()
        await wait_until(lambda: events.runtime.subscriber_count == 0, what="the subscription ends")
        again = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(include_snapshot=True))
        assert (await again.read()).HasField("batch")
        again.cancel()
        kv.cancel()


async def test_message_size_limit() -> None:
    async with gateway(server=ServerOptions(max_message_bytes=4096)) as running:
        error = await refused(running.stub.Generate(generate("a" * 5000)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [r async for r in running.stub.Generate(generate("a" * 100))][-1].HasField("finished")
        await asyncio.sleep(0)
        assert len(running.gateway.registry) == 0


async def test_a_response_over_the_message_limit_is_resource_exhausted_and_counted_so() -> None:
    """gRPC would refuse it only after the handler returned: counted OK, logged as a server error."""
    async with gateway(server=ServerOptions(max_message_bytes=700, metrics_port=0)) as running:
        inputs = [pb.TaskInput(item_id=str(n), text="x") for n in range(3)]
        error = await refused(running.stub.Embed(pb.EmbedRequest(context=task(), inputs=inputs)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "more than this gateway's" in (
            error.details() or ""
        )
        assert (
            running.server.metrics.registry.get_sample_value(
                "openengine_gateway_requests_total", {"rpc": "Embed", "code": "RESOURCE_EXHAUSTED"}
            )
            == 1
        )
        assert len((await running.stub.Embed(pb.EmbedRequest(context=task(), inputs=inputs[:1]))).outputs) == 1
