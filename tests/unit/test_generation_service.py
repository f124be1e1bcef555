"""``core.generation.GenerationService``: admission, the event stream and cleanup, for any driver."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest
from openengine_gateway import pb
from openengine_gateway.core import generation as generation_module
from openengine_gateway.core.generation import GenerationService
from openengine_gateway.errors import (
    AlreadyExists,
    EngineFailure,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from openengine_gateway.spi import (
    EventStream,
    GenerationEvent,
    GenerationRequest,
    KvSession,
    LoraAdapter,
    OutputFinished,
    PrefillDone,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
)

from tests.fakes import CoreParts, FakeBackend, collect, engine_set, ready, scripted

LENGTH = pb.FINISH_REASON_LENGTH


def service(parts: CoreParts, *backends: FakeBackend | tuple[FakeBackend, str]) -> GenerationService:
    return GenerationService(engine_set(*backends), parts.registry, parts.state, parts.loras, parts.background)


def request(request_id: str = "r1", **fields: object) -> pb.GenerateRequest:
    fields.setdefault("prompt", "hi")
    return pb.GenerateRequest(request_id=request_id, **fields)  # type: ignore[arg-type]


def delta(index: int, *ids: int) -> TokenDelta:
    return TokenDelta(index, [TokenRecord(i) for i in ids], "x" * len(ids))


def events(messages: list[pb.GenerateResponse]) -> list[str]:
    return [m.WhichOneof("event") or "" for m in messages]


async def test_a_stream_from_an_event_stream_driver() -> None:
    parts, backend = CoreParts(), FakeBackend()
    generation = service(parts, backend)
    stream = generation.generate(request(metadata={"k": "v"}))
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert "r1" in backend.streams and parts.registry.get("r1") is not None
    assert backend.requests[0].metadata == {"k": "v"}
    feed = backend.streams["r1"]
    feed.put(delta(0, 1))
    first = await asyncio.wait_for(waiter, 1)
    assert first.token.output_index == 0 and not first.HasField("usage")
    feed.put(UsageReport(2, 1))
    feed.put(OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(2)))
    rest = await collect(stream)
    assert events(rest) == ["finished"]
    assert rest[0].usage.total_tokens == 3
    assert parts.registry.get("r1") is None and parts.registry.recently_finished("r1")
    await parts.background.wait(1)
    assert backend.aborted == []  # a finished request is not aborted


async def test_a_stream_from_an_async_generator_driver() -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(
        delta(0, 1), delta(1, 2), UsageReport(1, 2), OutputFinished(1, LENGTH), OutputFinished(0, LENGTH)
    )
    messages = await collect(service(parts, backend).generate(request(sampling=pb.SamplingParams(num_sequences=2))))
    assert events(messages) == ["token", "token", "finished", "finished"]
    assert [m.HasField("usage") for m in messages] == [False, False, False, True]
    assert all(m.request_id == "r1" for m in messages)
    await parts.background.wait(1)
    assert backend.aborted == [] and len(parts.registry) == 0


async def test_missing_request_id_is_generated_and_echoed() -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(UsageReport(1, 0), OutputFinished(0, LENGTH))
    (message,) = await collect(service(parts, backend).generate(pb.GenerateRequest(prompt="x")))
    assert message.request_id.startswith("gw-") and message.request_id == backend.requests[0].request_id


# -- before acceptance ----------------------------------------------------------------------------


async def test_pre_acceptance_rejections_are_raised_before_any_message() -> None:
    parts = CoreParts()
    backend = FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))
    generation = service(parts, backend)
    cases: list[tuple[pb.GenerateRequest, type[Exception]]] = [
        (request(model="other"), NotFound),
        (pb.GenerateRequest(request_id="r"), InvalidArgument),
        (request(kv=pb.KvOptions(data_parallel_rank=2)), InvalidArgument),
    ]
    for message, kind in cases:
        with pytest.raises(kind):
            await anext(generation.generate(message))
    assert backend.requests == [] and len(parts.registry) == 0
    backend.on_generate = scripted(UsageReport(1, 0), OutputFinished(0, LENGTH))
    await collect(generation.generate(request(kv=pb.KvOptions(data_parallel_rank=1))))
    assert backend.requests[0].data_parallel_rank == 1


async def test_not_accepting_while_starting_or_draining() -> None:
    parts = CoreParts()
    generation = service(parts, FakeBackend())
    parts.state.started = False
    with pytest.raises(Unavailable, match="starting") as raised:
        await anext(generation.generate(request()))
    assert raised.value.retry_after_ms
    parts.state.started, parts.state.draining = True, True
    with pytest.raises(Unavailable, match="draining"):
        await anext(generation.generate(request()))


async def test_unknown_lora_is_not_found() -> None:
    parts = CoreParts()
    generation = service(parts, FakeBackend(model=pb.ModelInfo(supports_lora=True)))
    with pytest.raises(NotFound, match="no LoRA adapter named 'a'"):
        await anext(generation.generate(request(lora_name="a")))
    parts.loras.add(LoraAdapter(1, "a", "/x"))
    backend = FakeBackend(model=pb.ModelInfo(supports_lora=True))
    backend.on_generate = scripted(UsageReport(1, 0), OutputFinished(0, LENGTH))
    assert events(await collect(service(parts, backend).generate(request(lora_name="a")))) == ["finished"]
    assert backend.requests[0].lora_name == "a"


async def test_driver_rejection_is_a_status_and_frees_the_id() -> None:
    parts, backend = CoreParts(), FakeBackend()

    def reject(_request: GenerationRequest) -> EventStream:
        raise InvalidArgument("this engine cannot do that")

    backend.on_generate = reject
    with pytest.raises(InvalidArgument, match="cannot do that"):
        await anext(service(parts, backend).generate(request()))
    assert len(parts.registry) == 0 and not parts.registry.recently_finished("r1")


async def test_a_stream_that_rejects_before_its_first_event_is_a_status() -> None:
    """A proxy learns its remote's verdict from the stream: still before acceptance."""
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(UsageReport(1, 0), error=ResourceExhausted("remote is full", retry_after_ms=7))
    with pytest.raises(ResourceExhausted, match="remote is full") as raised:
        await anext(service(parts, backend).generate(request()))
    assert raised.value.retry_after_ms == 7
    assert len(parts.registry) == 0 and not parts.registry.recently_finished("r1")  # never accepted
    await parts.background.wait(1)
    assert backend.aborted == []  # the driver refused it: nothing of it runs there


async def test_request_ranks_of_several_engines_are_endpoint_ranks() -> None:
    parts = CoreParts()
    first = FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))
    second = FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))
    second.on_generate = scripted(UsageReport(1, 0), OutputFinished(0, LENGTH))
    generation = service(parts, (first, "a"), (second, "b"))
    await collect(generation.generate(request(model="b", kv=pb.KvOptions(data_parallel_rank=3))))
    assert second.requests[0].data_parallel_rank == 1  # endpoint rank 3 is "b"'s second replica
    with pytest.raises(InvalidArgument, match="not one of this model's ranks"):
        await anext(generation.generate(request("r2", model="b", kv=pb.KvOptions(data_parallel_rank=1))))


async def test_duplicate_in_flight_id_and_admission_limit() -> None:
    parts = CoreParts(max_in_flight=1)
    generation = service(parts, FakeBackend())
    first = generation.generate(request("a"))
    waiter = asyncio.ensure_future(anext(first))
    await asyncio.sleep(0)
    with pytest.raises(AlreadyExists):
        await anext(generation.generate(request("a")))
    with pytest.raises(ResourceExhausted):
        await anext(generation.generate(request("b")))
    assert parts.registry.get("a") is not None  # the rejected duplicate did not free the original
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    await first.aclose()


# -- after acceptance -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "retryable"),
    [
        (
            EngineFailure(pb.ERROR_CODE_KV_TRANSFER_FAILED, "lost", retryable=True, retry_after_ms=3),
            pb.ERROR_CODE_KV_TRANSFER_FAILED,
            True,
        ),
        (RuntimeError("bug"), pb.ERROR_CODE_INTERNAL, True),  # escaped the driver: retryable, naming it
        (ResourceExhausted("full"), pb.ERROR_CODE_OVERLOADED, True),
    ],
)
async def test_failure_after_acceptance_is_one_terminal_error(error: Exception, code: int, retryable: bool) -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(delta(0, 1), error=error)
    messages = await collect(service(parts, backend).generate(request()))
    assert events(messages) == ["token", "error"]
    assert messages[-1].error.code == code and messages[-1].error.retryable is retryable
    assert messages[-1].HasField("usage") and messages[-1].usage.completion_tokens == 1
    await asyncio.wait_for(backend.abort_called.wait(), 1)
    assert backend.aborted == ["r1"] and len(parts.registry) == 0


async def test_contract_violation_becomes_internal_error() -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(delta(3, 1))
    messages = await collect(service(parts, backend).generate(request()))
    assert events(messages) == ["error"]
    assert messages[0].error.code == pb.ERROR_CODE_INTERNAL and "output_index 3" in messages[0].error.message
    await asyncio.wait_for(backend.abort_called.wait(), 1)


async def test_stream_that_ends_early_is_an_internal_error() -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.on_generate = scripted(UsageReport(1, 1), OutputFinished(1, LENGTH))
    messages = await collect(service(parts, backend).generate(request(sampling=pb.SamplingParams(num_sequences=3))))
    assert events(messages) == ["finished", "error"]
    assert "before finishing outputs [0, 2]" in messages[-1].error.message


async def test_abort_finishes_open_outputs_as_cancelled() -> None:
    parts, backend = CoreParts(), FakeBackend()
    stream = service(parts, backend).generate(request(sampling=pb.SamplingParams(num_sequences=2)))
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r1"].put(delta(1, 5))
    backend.streams["r1"].put(OutputFinished(1, LENGTH))
    await asyncio.wait_for(waiter, 1)
    await ready(stream, 1)  # the finish of output 1 (no usage yet: output 0 is open)
    parts.registry.get("r1").abort("aborted by Abort")  # type: ignore[union-attr]
    rest = await collect(stream)
    assert [(m.finished.output_index, m.finished.reason, m.finished.message) for m in rest] == [
        (0, pb.FINISH_REASON_CANCELLED, "aborted by Abort")
    ]
    assert rest[-1].HasField("usage")
    await parts.background.wait(1)
    assert backend.aborted == ["r1"] and len(parts.registry) == 0  # once, though Abort and the stream's end both ask


async def test_an_engine_that_reports_cancellation_ends_the_stream_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    parts, backend = CoreParts(), FakeBackend()
    backend.facts.reports_cancellation = True  # a proxy: its remote sends the terminal events and usage
    stream = service(parts, backend).generate(request())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r1"].put(delta(0, 5))
    await asyncio.wait_for(waiter, 1)
    parts.registry.get("r1").abort("aborted by Abort")  # type: ignore[union-attr]
    await asyncio.wait_for(backend.abort_called.wait(), 1)
    backend.streams["r1"].put(UsageReport(7, 1))
    backend.streams["r1"].put(OutputFinished(0, pb.FINISH_REASON_CANCELLED, message="aborted over there"))
    backend.streams["r1"].finish()
    (final,) = await collect(stream)
    assert final.finished.message == "aborted over there" and final.usage.prompt_tokens == 7

    # an engine that does not end the stream in time is ended by the core
    monkeypatch.setattr(generation_module, "REPORTED_ABORT_GRACE_S", 0.01)
    stream = service(parts, backend).generate(request("r2"))
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r2"].put(delta(0, 5))
    await asyncio.wait_for(waiter, 1)
    parts.registry.get("r2").abort("aborted by Abort")  # type: ignore[union-attr]
    (final,) = await asyncio.wait_for(collect(stream), 1)
    assert final.finished.reason == pb.FINISH_REASON_CANCELLED and final.finished.message == "aborted by Abort"


async def test_a_handed_out_kv_session_is_remembered() -> None:
    """So that Abort of it, once pulled or expired, is ALREADY_FINISHED rather than unknown."""
    parts, backend = CoreParts(), FakeBackend(role=pb.ENGINE_ROLE_PREFILL)
    backend.on_generate = scripted(UsageReport(3, 0), PrefillDone(KvSession("session-1")))
    messages = await collect(service(parts, backend).generate(request()))
    assert messages[-1].prefill_ready.kv_session.session_id == "session-1"
    assert parts.registry.knows_session("session-1") and not parts.registry.knows_session("r1")


async def test_abort_of_a_prefill_is_a_cancelled_error() -> None:
    parts, backend = CoreParts(), FakeBackend(role=pb.ENGINE_ROLE_PREFILL)
    stream = service(parts, backend).generate(request())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    parts.registry.get("r1").abort("drain")  # type: ignore[union-attr]
    message = await asyncio.wait_for(waiter, 1)
    assert message.error.code == pb.ERROR_CODE_CANCELLED
    assert await collect(stream) == []


async def handed_off_unread() -> tuple[
    CoreParts, FakeBackend, AsyncGenerator[pb.GenerateResponse, None], asyncio.Future[pb.GenerateResponse]
]:
    """A prefill whose driver emitted its usage and PrefillDone (session ``s1``), both still unread."""
    parts, backend = CoreParts(), FakeBackend(role=pb.ENGINE_ROLE_PREFILL)
    backend.kv_sessions.add("s1")
    stream = cast(AsyncGenerator[pb.GenerateResponse, None], service(parts, backend).generate(request()))
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r1"].put(UsageReport(3, 0))
    backend.streams["r1"].put(PrefillDone(KvSession("s1")))
    return parts, backend, stream, waiter


async def test_an_aborted_prefill_releases_the_session_no_client_received() -> None:
    """Its PrefillDone was still unread when the abort dropped it: the engine's KV would have no owner."""
    parts, backend, stream, waiter = await handed_off_unread()
    parts.registry.get("r1").abort("aborted by Abort")  # type: ignore[union-attr]
    message = await asyncio.wait_for(waiter, 1)
    assert message.error.code == pb.ERROR_CODE_CANCELLED and message.usage.prompt_tokens == 3
    assert await collect(stream) == []
    await parts.background.wait(1)
    assert backend.released_sessions == ["s1"]


async def test_a_prefill_whose_client_went_away_releases_its_unread_session() -> None:
    parts, backend, stream, waiter = await handed_off_unread()
    waiter.cancel()  # the client went away before the handoff was read
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await stream.aclose()
    await parts.background.wait(1)
    assert backend.released_sessions == ["s1"]


async def test_client_going_away_aborts_the_driver() -> None:
    parts, backend = CoreParts(), FakeBackend()
    stream = service(parts, backend).generate(request())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r1"].put(delta(0, 1))
    await asyncio.wait_for(waiter, 1)
    await stream.aclose()  # the client cancelled or its deadline expired
    await asyncio.wait_for(backend.abort_called.wait(), 1)
    assert backend.aborted == ["r1"] and len(parts.registry) == 0


async def test_client_going_away_stops_a_generator_driver() -> None:
    parts, backend = CoreParts(), FakeBackend()
    closed = asyncio.Event()

    def endless(_request: GenerationRequest) -> EventStream:
        async def run() -> AsyncIterator[GenerationEvent]:
            try:
                while True:
                    yield delta(0, 1)
                    await asyncio.sleep(0)
            finally:
                closed.set()

        return EventStream.from_iterator(run())

    backend.on_generate = endless
    stream = service(parts, backend).generate(request())
    await anext(stream)
    await stream.aclose()
    await asyncio.wait_for(closed.wait(), 1)
    await asyncio.wait_for(backend.abort_called.wait(), 1)


async def test_an_id_stays_in_flight_until_the_driver_has_aborted_it() -> None:
    """Drivers find requests by id: a new request reusing the id before the old one's abort ran would be
    the one aborted, while the old one kept running."""
    parts, backend = CoreParts(), FakeBackend()
    generation = service(parts, backend)
    release = asyncio.Event()
    real_abort = backend.abort

    async def slow_abort(request_id: str) -> None:
        await release.wait()
        await real_abort(request_id)

    backend.abort = slow_abort  # type: ignore[method-assign]
    stream = generation.generate(request())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    backend.streams["r1"].put(delta(0, 1))
    await asyncio.wait_for(waiter, 1)
    await stream.aclose()  # the client went away; the driver's abort has not run yet
    with pytest.raises(AlreadyExists):
        await anext(generation.generate(request()))
    assert len(parts.registry) == 1
    release.set()
    await asyncio.wait_for(backend.abort_called.wait(), 1)
    await asyncio.sleep(0)
    assert len(parts.registry) == 0 and parts.registry.recently_finished("r1")
    reused = generation.generate(request())
    waiter = asyncio.ensure_future(anext(reused))
    await asyncio.sleep(0)
    backend.streams["r1"].put(delta(0, 2))
    assert (await asyncio.wait_for(waiter, 1)).HasField("token")
    await reused.aclose()


async def test_an_abort_after_the_final_message_finds_the_request_finished() -> None:
    """grpc resumes the handler only once the final message is written: meanwhile it is over."""
    parts, backend = CoreParts(), FakeBackend()
    stream = service(parts, backend).generate(request())
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    feed = backend.streams["r1"]
    feed.put(delta(0, 1))
    feed.put(UsageReport(2, 1))
    feed.put(OutputFinished(0, LENGTH))
    await asyncio.wait_for(waiter, 1)
    final = await anext(stream)  # the handler is suspended at its final message
    assert final.HasField("finished")
    active = parts.registry.get("r1")
    assert active is not None and active.ended
    active.abort("aborted by Abort")
    assert not active.aborted
    await collect(stream)
    await parts.background.wait(1)
    assert backend.aborted == [] and parts.registry.recently_finished("r1")
