"""A front gateway (``remote``) in front of a back gateway (``mock``), over real gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest
from openengine_backends.remote import RemoteBackend, RemoteSettings
from openengine_gateway import pb
from openengine_gateway.errors import ConfigurationError, EngineFailure
from openengine_gateway.spi import GenerationRequest, Load, Stopping
from openengine_gateway.testing import RunningGateway

from tests.fakes import eventually

from .support import back, front_and_back, remote


def generate(model: str, request_id: str, **fields: object) -> pb.GenerateRequest:
    fields.setdefault("prompt", "The quick brown fox")
    fields.setdefault("sampling", pb.SamplingParams(seed=7, temperature=1.0, num_sequences=2))
    fields.setdefault("stopping", pb.StoppingOptions(max_tokens=12))
    return pb.GenerateRequest(request_id=request_id, model=model, **fields)  # type: ignore[arg-type]


async def collect(running: RunningGateway, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [response async for response in running.stub.Generate(request)]


async def remaining(call: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:  # type: ignore[type-arg]
    """The rest of a stream already read from with ``read``."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def test_the_front_advertises_exactly_what_the_remote_does() -> None:
    async with front_and_back(mock={"data_parallel_size": 2, "enable_lora": False}) as (front, behind, _):
        ours = await front.stub.GetModelInfo(pb.GetModelInfoRequest(model="front"))
        theirs = await behind.stub.GetModelInfo(pb.GetModelInfoRequest(model="mock"))
        assert ours.served_model_name == "front"
        ours.served_model_name = theirs.served_model_name
        assert ours == theirs  # every capability and limit, presence included
        info = await front.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        remote_info = await behind.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert list(info.supported_models) == ["front"]
        for name in ("engine_name", "engine_version", "role", "parallelism", "instance_id"):
            assert getattr(info, name) == getattr(remote_info, name), name


async def test_streams_pass_through_unchanged() -> None:
    async with front_and_back() as (front, behind, _):
        request = generate(
            "front",
            "same",
            response=pb.ResponseOptions(return_output_logprobs=True),
            kv=pb.KvOptions(bypass_prefix_cache=True),  # so the second run is not served from the cache
        )
        through = await collect(front, request)
        request.model, request.request_id = "mock", "same"
        direct = await collect(behind, request)
    # same seed, same engine: every token, logprob, finish and usage (message boundaries may differ:
    # a lagging reader gets tokens coalesced)
    assert merged(through) == merged(direct)


def merged(messages: list[pb.GenerateResponse]) -> tuple[object, ...]:
    """A stream's content independent of how tokens were split into messages."""
    tokens: dict[int, list[pb.TokenInfo]] = {}
    text: dict[int, str] = {}
    for message in messages:
        if message.WhichOneof("event") == "token":
            tokens.setdefault(message.token.output_index, []).extend(message.token.tokens)
            text[message.token.output_index] = text.get(message.token.output_index, "") + message.token.text
    finishes = sorted(
        (m.finished.output_index, m.finished.SerializeToString()) for m in messages if m.HasField("finished")
    )
    return tokens, text, finishes, messages[-1].usage, [m.request_id for m in messages][:1]


async def test_a_remote_rejection_is_the_same_status_before_acceptance() -> None:
    async with front_and_back(mock={"decode_time_per_step_s": 0.01}) as (front, behind, _):
        # a candidate id beyond the mock's vocabulary is known only to the engine behind
        bad = generate(
            "front",
            "bad",
            response=pb.ResponseOptions(
                output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[1 << 20]))
            ),
        )
        with pytest.raises(grpc.aio.AioRpcError) as rejected:
            await collect(front, bad)
        assert rejected.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "vocabulary" in (rejected.value.details() or "")
        # the same id in flight on the remote (sent there directly) is a duplicate through the front
        busy = behind.stub.Generate(generate("mock", "dup", stopping=pb.StoppingOptions(max_tokens=200)))
        await busy.read()
        with pytest.raises(grpc.aio.AioRpcError) as duplicate:
            await collect(front, generate("front", "dup"))
        assert duplicate.value.code() == grpc.StatusCode.ALREADY_EXISTS
        await asyncio.sleep(0.2)  # the front must not abort the id: it is another client's request
        holder = behind.gateway.registry.get("dup")
        assert holder is not None and not holder.aborted
        busy.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as unknown:  # never accepted, so never finished
            await front.stub.Abort(pb.AbortRequest(request_id="bad"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_remote_engine_error_is_the_same_terminal_error() -> None:
    async with front_and_back(mock={"decode_time_per_step_s": 0.01}) as (front, _, engine):
        call = front.stub.Generate(generate("front", "crash", stopping=pb.StoppingOptions(max_tokens=500)))
        first = await call.read()
        assert first.WhichOneof("event") == "token"
        engine.fail("simulated crash")
        rest = await remaining(call)
        assert rest[-1].WhichOneof("event") == "error"
        error = rest[-1].error
        assert error.code == pb.ERROR_CODE_INTERNAL and error.retryable and "simulated crash" in error.message
        assert await call.code() == grpc.StatusCode.OK
        health = await front.stub.Health(pb.HealthRequest())
        assert health.state == pb.HEALTH_STATE_NOT_READY
        assert [c.name for c in health.checks if c.state == pb.HEALTH_STATE_NOT_READY] == ["remote", "scheduler"]


async def test_abort_and_cancellation_reach_the_remote() -> None:
    async with front_and_back(mock={"decode_time_per_step_s": 0.01}) as (front, behind, engine):
        long = pb.StoppingOptions(max_tokens=500)
        call = front.stub.Generate(generate("front", "to-abort", stopping=long))
        await call.read()
        assert behind.gateway.registry.get("to-abort") is not None
        answer = await front.stub.Abort(pb.AbortRequest(request_id="to-abort"))
        assert answer.status == pb.ABORT_STATUS_ABORTED
        rest = await remaining(call)
        assert {m.finished.reason for m in rest if m.WhichOneof("event") == "finished"} == {pb.FINISH_REASON_CANCELLED}
        await eventually(lambda: behind.gateway.registry.get("to-abort") is None)

        cancelled = front.stub.Generate(generate("front", "to-cancel", stopping=long))
        await cancelled.read()
        cancelled.cancel()
        await eventually(lambda: behind.gateway.registry.get("to-cancel") is None)
        await eventually(lambda: not any(core.running or core.waiting for core in engine.cores))


async def test_an_id_reused_after_a_cancel_is_never_cancelled_by_the_old_request_s_abort() -> None:
    """The front frees a cancelled request's id only once the remote has answered its Abort: an Abort
    still on its way when the id is reused would end the new request on the remote."""
    async with front_and_back(mock={"decode_time_per_step_s": 0.002}) as (front, _, _):
        one = pb.SamplingParams(seed=7, temperature=1.0)
        reasons: list[str] = []

        async def cancel_and_reuse(worker: int) -> None:
            for cycle in range(10):
                request_id = f"reused-{worker}-{cycle}"
                old = front.stub.Generate(
                    generate("front", request_id, sampling=one, stopping=pb.StoppingOptions(max_tokens=300))
                )
                await old.read()
                old.cancel()
                while True:  # at once, as a client retrying an id the gateway still holds
                    try:
                        again = await collect(
                            front,
                            generate("front", request_id, sampling=one, stopping=pb.StoppingOptions(max_tokens=3)),
                        )
                        break
                    except grpc.aio.AioRpcError as error:
                        assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error
                        await asyncio.sleep(0.005)
                reasons.append(pb.FinishReason.Name(again[-1].finished.reason))

        await asyncio.gather(*(cancel_and_reuse(worker) for worker in range(8)))
        assert set(reasons) == {"FINISH_REASON_LENGTH"}


async def test_tasks_lora_and_load_are_relayed(tmp_path: Path) -> None:
    async with front_and_back() as (front, behind, _):
        inputs = [pb.TaskInput(item_id="a", text="hello"), pb.TaskInput(item_id="b", token_ids=pb.TokenIds(ids=[1]))]
        context = pb.TaskRequestContext(request_id="e", model="front")
        through = await front.stub.Embed(pb.EmbedRequest(context=context, inputs=inputs))
        context.model = "mock"
        direct = await behind.stub.Embed(pb.EmbedRequest(context=context, inputs=inputs))
        assert through == direct
        adapter = pb.LoraAdapter(lora_id=3, lora_name="style", source_path=str(tmp_path))
        assert not (await front.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))).already_loaded
        assert [a.lora_name for a in (await behind.stub.ListLoras(pb.ListLorasRequest())).adapters] == ["style"]
        await front.stub.UnloadLora(pb.UnloadLoraRequest(lora_name="style"))
        assert not (await behind.stub.ListLoras(pb.ListLorasRequest())).adapters
        load = await front.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
        assert load.HasField("running_requests") and load.total_kv_blocks == 1024 and len(load.ranks) == 1


async def quiet(call: grpc.aio.UnaryStreamCall, within_s: float = 0.3) -> list[pb.KvEventBatch]:  # type: ignore[type-arg]
    """Every batch a subscription delivers until it has been quiet for ``within_s``."""
    batches = []
    with contextlib.suppress(TimeoutError):
        while True:
            batches.append((await asyncio.wait_for(call.read(), within_s)).batch)
    call.cancel()
    return batches


async def test_kv_events_are_relayed_and_resumed_exactly_after_a_disconnect() -> None:
    async with front_and_back(resubscribe_delay_s=0.3) as (front, behind, _):
        await eventually(lambda: behind.gateway.events.kv.subscriber_count == 1)  # the relay is subscribed
        subscription = front.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        await eventually(lambda: front.gateway.events.kv.subscriber_count == 1)
        await collect(front, generate("front", "one", sampling=pb.SamplingParams(seed=1)))
        first = await asyncio.wait_for(subscription.read(), 2)
        assert first.batch.events[0].WhichOneof("event") == "block_stored"
        # the back drops every subscriber; events happen before the relay subscribes again
        behind.gateway.events.kv.close(EngineFailure(pb.ERROR_CODE_OVERLOADED, "dropped", retryable=True))
        await collect(front, generate("front", "two", prompt="A completely different prompt"))
        relayed = [first.batch, *await quiet(subscription, 1.0)]
        published = await quiet(behind.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(start_sequence_number=1)))
    assert len(relayed) > 2 and relayed == published  # every batch once, in order, numbers and all


async def test_runtime_events_are_relayed_with_the_front_name() -> None:
    async with front_and_back(runtime_events="on") as (front, behind, _):
        subscription = front.stub.SubscribeRuntimeEvents(
            pb.SubscribeRuntimeEventsRequest(types=[pb.RUNTIME_EVENT_TYPE_FORWARD_PASS])
        )
        await eventually(lambda: front.gateway.events.runtime.subscriber_count == 1)
        await eventually(lambda: behind.gateway.events.runtime.subscriber_count == 1)  # the relay's
        await collect(front, generate("front", "r"))
        event = (await asyncio.wait_for(subscription.read(), 2)).runtime_event
        assert event.type == pb.RUNTIME_EVENT_TYPE_FORWARD_PASS and event.attributes["model"] == "front"
        subscription.cancel()


async def test_auto_asks_the_remote_what_it_publishes() -> None:
    async with back(enable_kv_events=False, enable_runtime_events=False) as (behind, _):
        backend = remote(behind.address)
        facts = await backend.start()
        await backend.stop()
    assert not facts.publishes_kv_events and not facts.publishes_runtime_events
    async with back() as (behind, _):
        backend = remote(behind.address)
        facts = await backend.start()
        await backend.stop()
    assert facts.publishes_kv_events and facts.publishes_runtime_events  # a quiet open stream counts


@pytest.mark.parametrize("role", ["aggregated", "prefill", "decode"])
async def test_the_inference_probe_is_the_remotes_own(role: str) -> None:
    """A decode engine takes no request without a KV session: the remote probes itself, its own way."""
    async with front_and_back(mock={"role": role}) as (front, _, _):
        health = await front.stub.Health(pb.HealthRequest(include_inference_probe=True))
    assert health.state == pb.HEALTH_STATE_READY, health
    assert health.checks[-1].name == "inference_probe"
    assert health.checks[-1].message.startswith("the remote's probe: ")


async def test_health_is_not_ready_while_the_remote_is_unreachable() -> None:
    async with back() as (behind, _):
        backend = remote(behind.address)
        await backend.start()
    try:
        (check,) = await backend.check_health()
        assert check.name == "remote" and check.state == pb.HEALTH_STATE_NOT_READY
        assert (await backend.load()) == Load()  # unknown, not an error
        with pytest.raises(EngineFailure):
            await backend.inference_probe()
    finally:
        await backend.stop()


async def test_start_fails_loudly() -> None:
    with pytest.raises(ConnectionError, match="not answering"):
        await remote("127.0.0.1:1", connect_timeout_s=0.3).start()
    async with back() as (behind, _):
        with pytest.raises(ConfigurationError, match=r"does not serve 'other'"):
            await remote(behind.address, model="other").start()
        backend = RemoteBackend(RemoteSettings(target=behind.address, kv_events="off", runtime_events="off"))
        await backend.start()  # the remote's only model, found by itself
        assert backend.remote_model == "mock"
        await backend.stop()
        with pytest.raises(ConfigurationError, match="token_env"):
            await remote(behind.address, token_env="OPENENGINE_TEST_UNSET_TOKEN").start()


async def test_stop_cancels_what_is_still_running() -> None:
    async with back(decode_time_per_step_s=0.01) as (behind, _):
        backend = remote(behind.address, kv_events="off", runtime_events="off")
        await backend.start()
        stream = backend.generate(GenerationRequest("s", "front", prompt="x", stopping=Stopping(max_tokens=500)))
        await anext(stream)
        await eventually(lambda: behind.gateway.registry.get("s") is not None)
        await backend.stop()
        with contextlib.suppress(StopAsyncIteration, EngineFailure):  # the stream ends cancelled, or failed
            await anext(stream)
        await eventually(lambda: behind.gateway.registry.get("s") is None)


class _Call:
    """A remote Generate call's bookkeeping surface: done, cancel and done-callbacks."""

    def __init__(self) -> None:
        self.callbacks: list[object] = []
        self.is_done = False

    def done(self) -> bool:
        return self.is_done

    def cancel(self) -> bool:
        self.is_done = True
        for callback in self.callbacks:
            callback(self)  # type: ignore[operator]
        return True

    def add_done_callback(self, callback: object) -> None:
        self.callbacks.append(callback)


@pytest.mark.parametrize("answer", [pb.ABORT_STATUS_ABORTED, None])
async def test_an_aborted_call_is_forgotten_once_it_ends_however_it_ends(
    monkeypatch: pytest.MonkeyPatch, answer: int | None
) -> None:
    """Aborted while its relay still reads it, then cancelled by the relay when its client leaves: no
    second abort comes, so the call must not stay remembered (one per request, until stop)."""
    backend = RemoteBackend(RemoteSettings(target="127.0.0.1:1"))
    call = _Call()
    backend._calls["r"] = call  # type: ignore[assignment]

    async def remote_abort(_request: pb.AbortRequest) -> int | None:
        return answer

    monkeypatch.setattr(backend, "_abort_remote", remote_abort)
    await backend.abort("r")
    if answer is None:  # the remote could not abort it: cancelled and forgotten at once
        assert call.is_done and backend._calls == {}
        return
    assert backend._calls == {"r": call}  # the relay still reads the remote's terminal events
    call.cancel()  # the relay's client left before they came
    assert backend._calls == {}
