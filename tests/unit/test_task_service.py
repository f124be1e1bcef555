"""``core.tasks.TaskService``: unary task calls in the shared request-id namespace."""

from __future__ import annotations

import asyncio

import pytest
from openengine_gateway import pb
from openengine_gateway.core.registry import ActiveRequest
from openengine_gateway.core.tasks import TaskService
from openengine_gateway.errors import (
    AlreadyExists,
    Cancelled,
    EngineFailure,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
)
from openengine_gateway.spi import (
    CandidateScore,
    Classification,
    ClassifyCall,
    DenseTensor,
    EmbedCall,
    Embedding,
    LoraAdapter,
    ScoreCall,
    ScoreResult,
    TaskUsage,
)

from tests.fakes import CoreParts, FakeBackend, engine_set

SEQ = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE
TASKS = pb.TaskCapabilities(
    embed=pb.EmbedCapabilities(supported=True, supports_lora=True),
    classify=pb.ClassifyCapabilities(supported=True),
    score=pb.ScoreCapabilities(supported=True),
)


def service(parts: CoreParts, *backends: FakeBackend | tuple[FakeBackend, str]) -> TaskService:
    return TaskService(engine_set(*backends), parts.registry, parts.state, parts.loras, parts.background)


def backend_with_tasks() -> FakeBackend:
    return FakeBackend(model=pb.ModelInfo(tasks=TASKS))


def embed_request(request_id: str = "r1", model: str = "m", **context: object) -> pb.EmbedRequest:
    return pb.EmbedRequest(
        context=pb.TaskRequestContext(request_id=request_id, model=model, **context),  # type: ignore[arg-type]
        inputs=[pb.TaskInput(item_id="a", text="x"), pb.TaskInput(item_id="b", text="y")],
    )


def vectors(count: int) -> list[Embedding]:
    return [Embedding(SEQ, DenseTensor(shape=[2], values=[0.0, 1.0])) for _ in range(count)]


async def test_embed() -> None:
    parts, backend = CoreParts(), backend_with_tasks()
    seen: list[EmbedCall] = []

    async def embed(call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        seen.append(call)
        assert parts.registry.get("r1") is not None  # in flight while the engine works
        return vectors(2), TaskUsage(input_tokens=2)

    backend.on_embed = embed
    response = await service(parts, backend).embed(embed_request(metadata={"k": "v"}))
    assert [(o.item_id, o.input_index) for o in response.outputs] == [("a", 0), ("b", 1)]
    assert response.request_id == "r1" and response.usage.input_tokens == 2
    assert seen[0].context.metadata == {"k": "v"} and [i.item_id for i in seen[0].items] == ["a", "b"]
    assert len(parts.registry) == 0 and parts.registry.recently_finished("r1")
    await parts.background.wait(1)
    assert backend.aborted == []


async def test_classify_and_score() -> None:
    parts, backend = CoreParts(), backend_with_tasks()

    async def classify(call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        output = Classification(SEQ, pb.TASK_VALUE_SEMANTICS_LOGITS, DenseTensor(shape=[1], values=[0.5]))
        return [output], TaskUsage(input_tokens=0)

    async def score(call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        candidate = CandidateScore(DenseTensor(shape=[1], values=[2.0]))
        result = ScoreResult(
            SEQ,
            pb.TASK_VALUE_SEMANTICS_RELEVANCE,
            pb.SCORE_NORMALIZATION_NONE,
            groups=[[candidate]],
            higher_is_better=True,
        )
        return result, TaskUsage(input_tokens=5)

    backend.on_classify, backend.on_score = classify, score
    tasks = service(parts, backend)
    context = pb.TaskRequestContext(request_id="c", model="m")
    classified = await tasks.classify(pb.ClassifyRequest(context=context, inputs=[pb.TaskInput(item_id="i", text="t")]))
    assert classified.outputs[0].item_id == "i" and classified.outputs[0].HasField("input_index")
    group = pb.ScoreGroup(
        group_id="g", query=pb.TaskInput(item_id="q", text="t"), candidates=[pb.TaskInput(item_id="d", text="u")]
    )
    scored = await tasks.score(
        pb.ScoreRequest(context=pb.TaskRequestContext(request_id="s", model="m"), groups=[group])
    )
    assert scored.groups[0].group_id == "g" and scored.groups[0].candidates[0].candidate_id == "d"
    assert scored.request_id == "s" and scored.usage.input_tokens == 5


@pytest.mark.parametrize(
    ("message", "kind", "match"),
    [
        (embed_request(request_id=""), InvalidArgument, "request_id"),
        (embed_request(model=""), InvalidArgument, "model is required"),  # required even with one engine
        (embed_request(model="other"), NotFound, "not served"),
        (embed_request(lora_name="missing"), NotFound, "'missing'"),
        (embed_request(priority=1), InvalidArgument, "priority"),
    ],
)
async def test_rejections_before_any_engine_work(message: pb.EmbedRequest, kind: type[Exception], match: str) -> None:
    parts, backend = CoreParts(), backend_with_tasks()
    with pytest.raises(kind, match=match):
        await service(parts, backend).embed(message)
    assert len(parts.registry) == 0


async def test_unsupported_task_is_failed_precondition() -> None:
    with pytest.raises(FailedPrecondition):
        await service(CoreParts(), FakeBackend()).embed(embed_request())


async def test_not_accepting() -> None:
    parts = CoreParts()
    parts.state.draining = True
    with pytest.raises(Unavailable):
        await service(parts, backend_with_tasks()).embed(embed_request())


async def test_ids_are_shared_with_generate() -> None:
    parts = CoreParts(max_in_flight=1)
    parts.registry.admit(ActiveRequest("r1", "generate", "m"))
    tasks = service(parts, backend_with_tasks())
    with pytest.raises(AlreadyExists):
        await tasks.embed(embed_request("r1"))
    with pytest.raises(ResourceExhausted):
        await tasks.embed(embed_request("r2"))


async def test_loaded_lora_is_passed_down() -> None:
    parts, backend = CoreParts(), backend_with_tasks()
    parts.loras.add(LoraAdapter(1, "l", "/a"))
    seen: list[EmbedCall] = []

    async def embed(call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        seen.append(call)
        return vectors(2), TaskUsage(input_tokens=0)

    backend.on_embed = embed
    await service(parts, backend).embed(embed_request(lora_name="l"))
    assert seen[0].context.lora_name == "l"


@pytest.mark.parametrize(
    ("error", "kind", "accepted"),
    [
        (EngineFailure(pb.ERROR_CODE_OVERLOADED, "busy", retryable=True, retry_after_ms=9), ResourceExhausted, True),
        (EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, "too long"), InvalidArgument, True),
        (RuntimeError("bug"), Unavailable, True),  # escaped the driver: its mistake, retryable
        (InvalidArgument("late validation"), InvalidArgument, False),  # the driver refused it
    ],
)
async def test_driver_failures_become_statuses(error: Exception, kind: type[Exception], accepted: bool) -> None:
    parts, backend = CoreParts(), backend_with_tasks()

    async def embed(_call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        raise error

    backend.on_embed = embed
    with pytest.raises(kind) as raised:
        await service(parts, backend).embed(embed_request())
    assert type(raised.value) is kind
    await parts.background.wait(1)  # a failed one is aborted in the driver first, then its id is free
    assert len(parts.registry) == 0
    # As in Generate: Abort of a request the driver refused answers NOT_FOUND, of a failed one ALREADY_FINISHED.
    assert parts.registry.recently_finished("r1") is accepted
    assert backend.aborted == (["r1"] if accepted else [])  # a refused one left nothing in the driver


async def test_driver_without_the_method_is_unimplemented() -> None:
    with pytest.raises(Unimplemented, match="does not implement Embed"):
        await service(CoreParts(), backend_with_tasks()).embed(embed_request())


async def test_malformed_result_is_the_driver_s_mistake() -> None:
    parts, backend = CoreParts(), backend_with_tasks()

    async def embed(_call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        return vectors(1), TaskUsage(input_tokens=0)

    backend.on_embed = embed
    with pytest.raises(
        Unavailable,
        match="backend 'fake' broke the backend SPI: embed returned a malformed result: the engine returned 1 outputs",
    ) as raised:
        await service(parts, backend).embed(embed_request())
    assert raised.value.retry_after_ms == 1000


async def test_abort_cancels_a_running_task() -> None:
    parts, backend = CoreParts(), backend_with_tasks()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def embed(_call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    backend.on_embed = embed
    call = asyncio.ensure_future(service(parts, backend).embed(embed_request()))
    await asyncio.wait_for(started.wait(), 1)
    parts.registry.get("r1").abort("aborted by Abort")  # type: ignore[union-attr]
    with pytest.raises(Cancelled, match="aborted by Abort"):
        await call
    await asyncio.wait_for(backend.abort_called.wait(), 1)
    await parts.background.wait(1)
    assert stopped.is_set() and len(parts.registry) == 0


async def test_client_cancellation_stops_the_work() -> None:
    parts, backend = CoreParts(), backend_with_tasks()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def embed(_call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    backend.on_embed = embed
    call = asyncio.ensure_future(service(parts, backend).embed(embed_request()))
    await asyncio.wait_for(started.wait(), 1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(stopped.wait(), 1)
    assert len(parts.registry) == 0
    await asyncio.wait_for(backend.abort_called.wait(), 1)
