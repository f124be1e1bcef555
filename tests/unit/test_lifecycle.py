"""``core.lifecycle``: Abort, Drain and Health, the same for every driver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from openengine_gateway import pb
from openengine_gateway.config import SplitSection
from openengine_gateway.core.health import worst
from openengine_gateway.core.lifecycle import LifecycleService
from openengine_gateway.core.registry import ActiveRequest
from openengine_gateway.errors import EngineFailure, InvalidArgument, NotFound, Unavailable, Unimplemented
from openengine_gateway.spi import (
    Classification,
    ClassifyCall,
    EmbedCall,
    Embedding,
    EventStream,
    GenerationRequest,
    HealthCheck,
    KvSession,
    OutputFinished,
    PrefillDone,
    TaskUsage,
    UsageReport,
)

from tests.fakes import CoreParts, FakeBackend, engine_set, ready, scripted

READY = pb.HEALTH_STATE_READY
NOT_READY = pb.HEALTH_STATE_NOT_READY


def service(
    parts: CoreParts,
    *backends: FakeBackend | tuple[FakeBackend, str],
    probe_timeout: float = 5.0,
    drain_progress_interval: float = 0.01,
) -> LifecycleService:
    return LifecycleService(
        engine_set(*backends),
        parts.registry,
        parts.state,
        probe_timeout=probe_timeout,
        drain_progress_interval=drain_progress_interval,
    )


def admit(parts: CoreParts, request_id: str, *, session: str | None = None, model: str = "m") -> ActiveRequest:
    """An in-flight request whose stop ends it, as the generation service's does."""
    request = ActiveRequest(request_id, "generate", model, kv_session_id=session)
    request.stop = lambda _reason: parts.registry.release(request)
    parts.registry.admit(request)
    return request


def finish(parts: CoreParts, request: ActiveRequest) -> None:
    parts.registry.release(request)


# -- Abort --------------------------------------------------------------------------------------


async def test_abort_needs_exactly_one_target() -> None:
    with pytest.raises(InvalidArgument, match="exactly one abort target"):
        await service(CoreParts(), FakeBackend()).abort(pb.AbortRequest())


async def test_abort_by_request_id() -> None:
    parts = CoreParts()
    lifecycle = service(parts, FakeBackend())
    request = admit(parts, "r1")
    response = await lifecycle.abort(pb.AbortRequest(request_id="r1"))
    assert response.status == pb.ABORT_STATUS_ABORTED
    assert request.aborted and request.abort_reason == "aborted by Abort"
    # Finished (by the abort itself): a second abort is a successful, idempotent outcome.
    again = await lifecycle.abort(pb.AbortRequest(request_id="r1"))
    assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_of_a_request_that_finished_on_its_own() -> None:
    parts = CoreParts()
    finish(parts, admit(parts, "done"))
    response = await service(parts, FakeBackend()).abort(pb.AbortRequest(request_id="done"))
    assert response.status == pb.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_of_an_unknown_or_forgotten_request_is_not_found() -> None:
    parts = CoreParts(finished_window=1)
    finish(parts, admit(parts, "old"))
    finish(parts, admit(parts, "new"))
    lifecycle = service(parts, FakeBackend())
    with pytest.raises(NotFound, match="'old'"):
        await lifecycle.abort(pb.AbortRequest(request_id="old"))
    with pytest.raises(NotFound):
        await lifecycle.abort(pb.AbortRequest(request_id="never"))
    with pytest.raises(InvalidArgument, match="non-empty"):
        await lifecycle.abort(pb.AbortRequest(request_id=""))


async def test_abort_on_an_engine_without_abort_is_unimplemented() -> None:
    parts = CoreParts()
    request = admit(parts, "r1")
    with pytest.raises(Unimplemented, match="does not support abort"):
        await service(parts, FakeBackend(supports_abort=False)).abort(pb.AbortRequest(request_id="r1"))
    assert not request.aborted


async def test_abort_by_kv_session() -> None:
    parts = CoreParts()
    backend = FakeBackend()
    backend.kv_sessions = {"s1", "s2"}
    lifecycle = service(parts, backend)
    attached = admit(parts, "r1", session="s1")
    other = admit(parts, "r2", session="s2")
    response = await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s1")))
    assert response.status == pb.ABORT_STATUS_ABORTED
    assert attached.aborted and not other.aborted
    assert backend.released_sessions == ["s1"]
    # A session only the engine holds (no request attached) is aborted too.
    finish(parts, other)
    assert (await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s2")))).status == 1


async def test_aborting_a_session_again_is_already_finished() -> None:
    """Idempotent, as for requests: a session the gateway released or handed out is not unknown."""
    parts, backend = CoreParts(), FakeBackend()
    backend.kv_sessions = {"s1"}
    lifecycle = service(parts, backend)
    first = await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s1")))
    again = await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s1")))
    assert (first.status, again.status) == (pb.ABORT_STATUS_ABORTED, pb.ABORT_STATUS_ALREADY_FINISHED)
    parts.registry.remember_session("pulled")  # handed out in a PrefillReady, since pulled by its decode
    pulled = await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="pulled")))
    assert pulled.status == pb.ABORT_STATUS_ALREADY_FINISHED and backend.released_sessions == ["s1"]


async def test_abort_of_an_unknown_session() -> None:
    lifecycle = service(CoreParts(), FakeBackend())
    with pytest.raises(NotFound, match="'s9'"):
        await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s9")))
    with pytest.raises(InvalidArgument, match="session_id"):
        await lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef()))


async def test_abort_all_requests() -> None:
    parts = CoreParts()
    lifecycle = service(parts, FakeBackend())
    requests = [admit(parts, f"r{i}") for i in range(3)]
    response = await lifecycle.abort(pb.AbortRequest(all_requests=pb.AllRequests()))
    assert response.status == pb.ABORT_STATUS_ABORTED and "3" in response.message
    assert all(r.aborted for r in requests) and len(parts.registry) == 0
    assert (await lifecycle.abort(pb.AbortRequest(all_requests=pb.AllRequests()))).status == pb.ABORT_STATUS_ABORTED


# -- Drain --------------------------------------------------------------------------------------


def states(responses: list[pb.DrainResponse]) -> list[str]:
    return [
        pb.DrainState.Name(r.state) if r.WhichOneof("event") == "state" else pb.ErrorCode.Name(r.error.code)
        for r in responses
    ]


async def drain(lifecycle: LifecycleService, **fields: object) -> AsyncIterator[pb.DrainResponse]:
    return lifecycle.drain(pb.DrainRequest(**fields))  # type: ignore[arg-type]


async def test_drain_of_an_idle_gateway() -> None:
    parts = CoreParts()
    responses = [
        r async for r in service(parts, FakeBackend()).drain(pb.DrainRequest(stop_accepting_new_requests=True))
    ]
    assert states(responses) == ["DRAIN_STATE_STARTED", "DRAIN_STATE_COMPLETE"]
    for response in responses:
        assert response.HasField("in_flight_requests") and response.in_flight_requests == 0
        assert not response.HasField("open_kv_sessions")  # no engine reports sessions: unknown
    assert parts.state.draining
    with pytest.raises(Unavailable, match="draining"):
        parts.state.check_accepting()


async def test_drain_without_stop_accepting_keeps_admitting() -> None:
    parts = CoreParts()
    responses = [r async for r in service(parts, FakeBackend()).drain(pb.DrainRequest())]
    assert states(responses)[-1] == "DRAIN_STATE_COMPLETE"
    parts.state.check_accepting()


async def test_drain_reports_progress_until_complete() -> None:
    parts = CoreParts()
    first, second = admit(parts, "a"), admit(parts, "b")
    stream = service(parts, FakeBackend()).drain(pb.DrainRequest(stop_accepting_new_requests=True))
    started = await anext(stream)
    assert states([started]) == ["DRAIN_STATE_STARTED"] and started.in_flight_requests == 2
    finish(parts, first)
    progress = await anext(stream)
    assert states([progress]) == ["DRAIN_STATE_IN_PROGRESS"] and progress.in_flight_requests == 1
    finish(parts, second)
    complete = await anext(stream)
    assert states([complete]) == ["DRAIN_STATE_COMPLETE"] and complete.in_flight_requests == 0
    assert await ready(stream) == []


async def test_a_release_while_progress_is_being_sent_is_not_missed() -> None:
    """The last request ending while IN_PROGRESS is written completes the drain now, not an interval later."""
    parts = CoreParts()
    first, second = admit(parts, "a"), admit(parts, "b")
    stream = service(parts, FakeBackend(), drain_progress_interval=60).drain(pb.DrainRequest())
    await anext(stream)
    finish(parts, first)
    assert states([await asyncio.wait_for(anext(stream), 1)]) == ["DRAIN_STATE_IN_PROGRESS"]
    finish(parts, second)  # the stream is suspended at its IN_PROGRESS message
    assert states([await asyncio.wait_for(anext(stream), 1)]) == ["DRAIN_STATE_COMPLETE"]


async def test_drain_counts_open_kv_sessions() -> None:
    parts = CoreParts()
    backend = FakeBackend()
    backend.report_kv_sessions = True
    backend.kv_sessions = {"s1"}
    stream = service(parts, backend).drain(pb.DrainRequest())
    started = await anext(stream)
    assert started.HasField("open_kv_sessions") and started.open_kv_sessions == 1
    backend.kv_sessions.clear()
    complete = await anext(stream)
    assert states([complete]) == ["DRAIN_STATE_COMPLETE"]
    assert complete.HasField("open_kv_sessions") and complete.open_kv_sessions == 0  # a reported zero


async def test_drain_deadline_without_abort_ends_with_one_error() -> None:
    parts = CoreParts()
    admit(parts, "a")
    responses = [r async for r in service(parts, FakeBackend()).drain(pb.DrainRequest(deadline_ms=0))]
    assert states(responses) == ["DRAIN_STATE_STARTED", "ERROR_CODE_DRAINING"]
    error = responses[-1].error
    assert error.retryable and error.HasField("retry_after_ms")
    assert error.details["in_flight_requests"] == 1
    assert "open_kv_sessions" not in error.details  # no engine reports sessions: unknown, as in DrainResponse
    assert error.message == "drain deadline passed with 1 requests open"
    assert len(parts.registry) == 1  # nothing was aborted


async def test_drain_deadline_then_abort() -> None:
    parts = CoreParts()
    backend = FakeBackend()
    backend.report_kv_sessions = True
    backend.kv_sessions = {"s1"}
    request = admit(parts, "a")
    responses = [
        r async for r in service(parts, backend).drain(pb.DrainRequest(deadline_ms=0, abort_after_deadline=True))
    ]
    assert states(responses)[0] == "DRAIN_STATE_STARTED" and states(responses)[-1] == "DRAIN_STATE_COMPLETE"
    assert "ERROR_CODE_DRAINING" not in states(responses)
    assert request.aborted and request.abort_reason == "aborted by Drain after its deadline"
    assert backend.released_sessions == ["s1"]


async def test_drain_with_a_future_deadline_completes_first() -> None:
    parts = CoreParts()
    request = admit(parts, "a")
    stream = service(parts, FakeBackend()).drain(pb.DrainRequest(deadline_ms=60_000, abort_after_deadline=True))
    await anext(stream)
    finish(parts, request)
    assert states(await ready_all(stream)) == ["DRAIN_STATE_COMPLETE"]
    assert not request.aborted


async def test_absent_deadline_means_no_deadline() -> None:
    parts = CoreParts()
    request = admit(parts, "a")
    stream = service(parts, FakeBackend()).drain(pb.DrainRequest(abort_after_deadline=True))
    await anext(stream)
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # several progress intervals: still waiting, nothing aborted
    assert not waiter.done() and not request.aborted
    finish(parts, request)
    assert states([await asyncio.wait_for(waiter, 1)]) == ["DRAIN_STATE_COMPLETE"]


async def test_a_failure_after_acceptance_is_one_terminal_error() -> None:
    """Once STARTED was sent, a failure ends the stream with an EngineError, not a status."""
    parts = CoreParts()
    backend = FakeBackend()
    request = admit(parts, "a")
    stream = service(parts, backend).drain(pb.DrainRequest())
    await anext(stream)
    backend.load_error = RuntimeError("engine unreachable")
    finish(parts, request)
    responses = await ready_all(stream)
    assert states(responses) == ["ERROR_CODE_INTERNAL"]
    assert "engine unreachable" in responses[0].error.message


async def ready_all(stream: AsyncIterator[pb.DrainResponse]) -> list[pb.DrainResponse]:
    return await asyncio.wait_for(_collect(stream), 2)


async def _collect(stream: AsyncIterator[pb.DrainResponse]) -> list[pb.DrainResponse]:
    return [r async for r in stream]


# -- Health -------------------------------------------------------------------------------------


def test_worst() -> None:
    assert worst([]) == READY
    assert worst([READY, pb.HEALTH_STATE_DEGRADED]) == pb.HEALTH_STATE_DEGRADED
    assert worst([pb.HEALTH_STATE_STARTING, pb.HEALTH_STATE_DEGRADED]) == pb.HEALTH_STATE_STARTING
    assert worst([READY, NOT_READY, pb.HEALTH_STATE_STARTING]) == NOT_READY


async def test_health_while_starting() -> None:
    parts = CoreParts()
    parts.state.started = False
    response = await service(parts, FakeBackend()).health(pb.HealthRequest())
    assert response.state == pb.HEALTH_STATE_STARTING
    assert [(c.name, c.state) for c in response.checks] == [("grpc", pb.HEALTH_STATE_STARTING)]


async def test_health_combines_engine_checks() -> None:
    backend = FakeBackend()
    lifecycle = service(CoreParts(), backend)
    response = await lifecycle.health(pb.HealthRequest())
    assert response.state == READY
    assert [(c.name, c.state) for c in response.checks] == [("grpc", READY), ("model", READY)]
    backend.health_checks.append(HealthCheck("kv_connector", pb.HEALTH_STATE_DEGRADED, "slow"))
    assert (await lifecycle.health(pb.HealthRequest())).state == pb.HEALTH_STATE_DEGRADED
    backend.health_checks.append(HealthCheck("scheduler", NOT_READY, "stuck"))
    assert (await lifecycle.health(pb.HealthRequest())).state == NOT_READY


async def test_health_while_draining() -> None:
    parts = CoreParts()
    parts.state.draining = True
    assert (await service(parts, FakeBackend()).health(pb.HealthRequest())).state == pb.HEALTH_STATE_DRAINING


async def test_health_of_several_engines_and_model_selection() -> None:
    healthy, sick = FakeBackend(), FakeBackend()
    sick.health_checks = [HealthCheck("model", NOT_READY, "oom")]
    lifecycle = service(CoreParts(), (healthy, "a"), (sick, "b"))
    everything = await lifecycle.health(pb.HealthRequest())
    assert everything.state == NOT_READY
    assert [c.message for c in everything.checks[1:]] == ["a: ok", "b: oom"]
    # model belongs to the probe ("used when include_inference_probe is true"): ignored without it.
    assert await lifecycle.health(pb.HealthRequest(model="zzz")) == everything
    healthy.on_generate = scripted(UsageReport(1, 1), OutputFinished(0, pb.FINISH_REASON_LENGTH))
    only_a = await lifecycle.health(pb.HealthRequest(model="a", include_inference_probe=True))
    assert only_a.state == READY and [c.message for c in only_a.checks[1:]] == ["a: ok", "a: generated a token"]
    with pytest.raises(NotFound):
        await lifecycle.health(pb.HealthRequest(model="zzz", include_inference_probe=True))


@pytest.mark.parametrize(
    ("failure", "message"),
    [(RuntimeError("driver bug"), "b: health check failed: RuntimeError: driver bug"), (None, "b: health check took")],
    ids=["raises", "hangs"],
)
async def test_a_check_that_raises_or_hangs_is_that_engine_not_ready(
    monkeypatch: pytest.MonkeyPatch, failure: Exception | None, message: str
) -> None:
    """Not a failed Health for every engine behind the endpoint."""
    from openengine_gateway.core import health as module

    monkeypatch.setattr(module, "CHECK_TIMEOUT_S", 0.05)
    healthy, broken = FakeBackend(), FakeBackend()

    async def check_health() -> list[HealthCheck]:
        if failure is not None:
            raise failure
        await asyncio.sleep(10)
        return []

    broken.check_health = check_health  # type: ignore[method-assign]
    response = await service(CoreParts(), (healthy, "a"), (broken, "b")).health(pb.HealthRequest())
    assert response.state == NOT_READY
    assert [(c.name, c.state) for c in response.checks] == [("grpc", READY), ("model", READY), ("engine", NOT_READY)]
    assert response.checks[2].message.startswith(message)


async def test_engines_are_checked_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several hung engines cost one check's timeout, not one each."""
    from openengine_gateway.core import health as module

    monkeypatch.setattr(module, "CHECK_TIMEOUT_S", 0.5)

    async def hang() -> list[HealthCheck]:
        await asyncio.sleep(10)
        return []

    hung = [FakeBackend() for _ in range(3)]
    for backend in hung:
        backend.check_health = hang  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await service(CoreParts(), *((b, n) for b, n in zip(hung, "abc", strict=True))).health(
        pb.HealthRequest()
    )
    assert loop.time() - started < 1.2 and [c.state for c in response.checks[1:]] == [NOT_READY] * 3  # serial: 1.5 s


async def test_health_role_check_belongs_to_the_probe() -> None:
    backend = FakeBackend(role=pb.ENGINE_ROLE_PREFILL)
    backend.on_generate = scripted(PrefillDone(KvSession("s1")))
    lifecycle = service(CoreParts(), backend)
    matching = await lifecycle.health(pb.HealthRequest(role=pb.ENGINE_ROLE_PREFILL, include_inference_probe=True))
    assert matching.state == READY and [c.name for c in matching.checks[-2:]] == ["role", "inference_probe"]
    wrong = await lifecycle.health(pb.HealthRequest(role=pb.ENGINE_ROLE_DECODE, include_inference_probe=True))
    assert wrong.state == NOT_READY
    assert wrong.checks[-2].message == "engine role is ENGINE_ROLE_PREFILL, expected ENGINE_ROLE_DECODE"
    without_probe = await lifecycle.health(pb.HealthRequest(role=pb.ENGINE_ROLE_DECODE))
    assert without_probe.state == READY and "role" not in [c.name for c in without_probe.checks]
    with pytest.raises(InvalidArgument, match="unknown role 9"):
        await lifecycle.health(pb.HealthRequest(role=9))  # type: ignore[arg-type]


async def test_inference_probe_generates_one_token() -> None:
    backend = FakeBackend()
    backend.on_generate = scripted(UsageReport(1, 1), OutputFinished(0, pb.FINISH_REASON_LENGTH))
    response = await service(CoreParts(), backend).health(pb.HealthRequest(include_inference_probe=True))
    assert response.state == READY
    assert (response.checks[-1].name, response.checks[-1].message) == ("inference_probe", "generated a token")
    (probe,) = backend.requests
    assert probe.prompt == "Hello" and probe.stopping.max_tokens == 1
    assert backend.aborted == []


async def test_inference_probe_uses_token_ids_when_text_is_not_accepted() -> None:
    backend = FakeBackend(model=pb.ModelInfo(supports_text_input=False))
    backend.on_generate = scripted(OutputFinished(0, pb.FINISH_REASON_LENGTH))
    await service(CoreParts(), backend).health(pb.HealthRequest(include_inference_probe=True))
    assert backend.requests[0].prompt is None and list(backend.requests[0].prompt_token_ids or []) == [0]


async def test_prefill_probe_releases_its_session() -> None:
    backend = FakeBackend(role=pb.ENGINE_ROLE_PREFILL)
    backend.kv_sessions = {"probe-session"}
    backend.on_generate = scripted(PrefillDone(KvSession("probe-session")))
    response = await service(CoreParts(), backend).health(pb.HealthRequest(include_inference_probe=True))
    assert response.checks[-1].message == "prefill produced a KV session"
    assert backend.released_sessions == ["probe-session"]


async def test_a_pooling_engine_is_probed_with_its_task() -> None:
    """No generation advertised (a pooling model): the probe embeds, or classifies, one input."""
    embeds = pb.EmbedCapabilities(supported=True, input_types=[pb.TASK_INPUT_TYPE_TEXT])
    embedder = FakeBackend(model=pb.ModelInfo(tasks=pb.TaskCapabilities(embed=embeds)))
    classifier = FakeBackend(
        model=pb.ModelInfo(
            tasks=pb.TaskCapabilities(
                embed=pb.EmbedCapabilities(supported=False),
                classify=pb.ClassifyCapabilities(supported=True, input_types=[pb.TASK_INPUT_TYPE_TOKEN_IDS]),
            )
        )
    )
    seen: list[EmbedCall | ClassifyCall] = []

    async def embed(call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        seen.append(call)
        return [], TaskUsage(input_tokens=0)

    async def classify(call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        seen.append(call)
        raise EngineFailure(pb.ERROR_CODE_INTERNAL, "no classifier head")

    embedder.on_embed, classifier.on_classify = embed, classify
    probe = pb.HealthRequest(include_inference_probe=True)
    assert (await service(CoreParts(), embedder).health(probe)).checks[-1].message == "embedded an input"
    failed = await service(CoreParts(), classifier).health(probe)
    assert failed.state == NOT_READY and failed.checks[-1].message == "no classifier head"
    assert [item.text for item in seen[0].items] == ["Hello"] and list(seen[1].items[0].token_ids or []) == [0]
    assert embedder.requests == classifier.requests == [] and classifier.aborted == [seen[1].context.request_id]


@pytest.mark.parametrize(
    ("events", "error", "message"),
    [
        ((), EngineFailure(pb.ERROR_CODE_INTERNAL, "CUDA error"), "CUDA error"),
        ((UsageReport(1, 0),), None, "ended without a result"),
    ],
)
async def test_failed_probe_is_a_not_ready_check(
    events: tuple[UsageReport, ...], error: BaseException | None, message: str
) -> None:
    backend = FakeBackend()
    backend.on_generate = scripted(*events, error=error)
    response = await service(CoreParts(), backend).health(pb.HealthRequest(include_inference_probe=True))
    assert response.state == NOT_READY
    assert response.checks[-1].state == NOT_READY and message in response.checks[-1].message
    assert len(backend.aborted) == 1 and backend.aborted[0].startswith("probe-")


async def test_probe_timeout() -> None:
    backend = FakeBackend()
    streams: list[EventStream] = []

    def never(_request: GenerationRequest) -> EventStream:
        streams.append(EventStream())
        return streams[-1]

    backend.on_generate = never
    response = await service(CoreParts(), backend, probe_timeout=0.02).health(
        pb.HealthRequest(include_inference_probe=True)
    )
    assert response.checks[-1].state == NOT_READY and "no result within 0.02s" in response.checks[-1].message
    assert len(backend.aborted) == 1


async def test_shutdown_ends_an_open_drain_with_one_terminal_error() -> None:
    """After STARTED a failure is an EngineError, never the transport's status when the server stops."""
    parts = CoreParts()
    admit(parts, "a")  # never ends
    lifecycle = service(parts, FakeBackend(), drain_progress_interval=0.05)
    stream = lifecycle.drain(pb.DrainRequest())
    assert states([await anext(stream)]) == ["DRAIN_STATE_STARTED"]
    lifecycle.close("the gateway is shutting down")
    last = await asyncio.wait_for(anext(stream), 1)
    assert states([last]) == ["ERROR_CODE_DRAINING"] and last.error.message == "the gateway is shutting down"
    assert last.error.retryable
    assert await ready(stream) == []


async def test_a_split_s_probe_is_one_check_naming_every_engine() -> None:
    first, second = FakeBackend(), FakeBackend()
    for backend in (first, second):
        backend.on_generate = scripted(UsageReport(1, 1), OutputFinished(0, pb.FINISH_REASON_LENGTH))
    engines = engine_set((first, "a"), (second, "b"))
    engines.reroute([SplitSection.model_validate({"name": "ab", "engines": {"a": 1, "b": 1}})], [])
    lifecycle = LifecycleService(engines, CoreParts().registry, CoreParts().state)
    request = pb.HealthRequest(model="ab", include_inference_probe=True, role=pb.ENGINE_ROLE_AGGREGATED)
    response = await lifecycle.health(request)
    assert [check.name for check in response.checks[-2:]] == ["role", "inference_probe"]
    assert [c.name for c in response.checks].count("inference_probe") == 1, "the contract's one probe of the model"
    assert response.checks[-1].message == "a: generated a token; b: generated a token"
    assert response.state == READY
    second.on_generate = scripted(error=EngineFailure(pb.ERROR_CODE_INTERNAL, "CUDA error"))
    failed = await lifecycle.health(request)
    assert failed.checks[-1].state == NOT_READY and failed.state == NOT_READY
    assert failed.checks[-1].message == "a: generated a token; b: CUDA error"
