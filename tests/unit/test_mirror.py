"""``core.mirror``: copies of a route's requests on its shadow engine, never in the primary's way."""

from __future__ import annotations

import asyncio

from openengine_gateway import pb
from openengine_gateway.config import MirrorSection
from openengine_gateway.core.agreement import Agreement
from openengine_gateway.core.generation import GenerationService
from openengine_gateway.core.mirror import Mirroring
from openengine_gateway.engines import EngineSet
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import EventStream, GenerationRequest, OutputFinished, TokenDelta, TokenRecord, UsageReport

from tests.fakes import CoreParts, FakeBackend, collect, engine_set, scripted

LENGTH = pb.FINISH_REASON_LENGTH


def _backend(*ids: int, tokenizer: str | None = "t") -> FakeBackend:
    backend = FakeBackend(model=pb.ModelInfo(supports_text_input=True, supports_token_ids_input=True))
    backend.facts.tokenizer_id = tokenizer
    backend.on_generate = scripted(
        *(TokenDelta(0, [TokenRecord(i)], chr(i)) for i in ids), UsageReport(1, len(ids)), OutputFinished(0, LENGTH)
    )
    return backend


def _mirrored(primary: FakeBackend, shadow: FakeBackend, **mirror: object) -> tuple[GenerationService, Agreement]:
    parts = CoreParts()
    engines: EngineSet = engine_set((primary, "p"), (shadow, "s"))
    engines.reroute([], [MirrorSection.model_validate({"name": "p", "shadow": "s", **mirror})])
    agreement = Agreement()
    mirroring = Mirroring(parts.background, agreement)
    service = GenerationService(
        engines, parts.registry, parts.state, parts.loras, parts.background, mirroring=mirroring
    )
    return service, agreement


def _greedy(request_id: str = "r1", **fields: object) -> pb.GenerateRequest:
    fields.setdefault("prompt", "hi")
    return pb.GenerateRequest(request_id=request_id, model="p", sampling=pb.SamplingParams(temperature=0), **fields)  # type: ignore[arg-type]


async def _settled() -> None:
    for _ in range(100):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


async def test_a_copy_runs_on_the_shadow_with_an_id_of_its_own_and_is_compared() -> None:
    primary, shadow = _backend(65, 66, 67), _backend(65, 66, 68)
    service, agreement = _mirrored(primary, shadow)
    messages = await collect(service.generate(_greedy()))
    await _settled()
    assert "".join(m.token.text for m in messages if m.HasField("token")) == "ABC"
    (copy,) = shadow.requests
    assert copy.request_id.startswith("mirror-") and copy.request_id != "r1" and copy.prompt == "hi"
    stats = agreement.pairs["p", "s"]
    assert stats.copies["compared"] == 1 and stats.diverged["tokens"] == 1 and stats.identical["tokens"] == 0
    assert stats.divergence["tokens"].counts[stats.divergence["tokens"].bounds.index(2.0)] == 1
    assert stats.finish_reasons == {("LENGTH", "LENGTH"): 1}


async def test_a_failing_shadow_is_counted_and_the_primary_is_untouched() -> None:
    primary, shadow = _backend(65, 66), _backend()
    shadow.on_generate = scripted(error=EngineFailure(pb.ERROR_CODE_OVERLOADED, "busy"))
    service, agreement = _mirrored(primary, shadow)
    messages = await collect(service.generate(_greedy()))
    await _settled()
    assert [m.WhichOneof("event") for m in messages][-1] == "finished"
    stats = agreement.pairs["p", "s"]
    assert stats.errors == {("shadow", "OVERLOADED"): 1} and stats.identical == {"tokens": 0, "text": 0}


async def test_copies_past_max_in_flight_are_shed() -> None:
    primary, shadow = _backend(65), FakeBackend()
    shadow.facts.tokenizer_id = "t"
    hold: list[EventStream] = []

    def held(_request: GenerationRequest) -> EventStream:
        stream = EventStream()
        hold.append(stream)
        return stream

    shadow.on_generate = held
    service, agreement = _mirrored(primary, shadow, max_in_flight=2)
    for i in range(5):
        await collect(service.generate(_greedy(f"r{i}")))
    stats = agreement.pairs["p", "s"]
    assert len(hold) == 2 and stats.copies["shed"] == 3
    for stream in hold:
        stream.put(OutputFinished(0, LENGTH))
        stream.finish()
    await _settled()
    await collect(service.generate(_greedy("again")))
    assert len(hold) == 3  # the copies that ended made room


async def test_an_aborted_primary_aborts_its_copy() -> None:
    primary, shadow = FakeBackend(), FakeBackend()
    primary.facts.tokenizer_id = shadow.facts.tokenizer_id = "t"
    streams: list[EventStream] = []

    def open_stream(_request: GenerationRequest) -> EventStream:
        stream = EventStream()
        streams.append(stream)
        return stream

    primary.on_generate = shadow.on_generate = open_stream
    service, agreement = _mirrored(primary, shadow)
    parts_registry = service._registry  # the test aborts as the lifecycle service does
    stream = service.generate(_greedy())
    consumer = asyncio.ensure_future(collect(stream))
    await asyncio.sleep(0.01)
    (copy,) = shadow.requests
    active = parts_registry.get("r1")
    assert active is not None
    active.abort("aborted by Abort")
    await consumer
    await shadow.abort_called.wait()
    assert copy.request_id in shadow.aborted
    assert agreement.pairs["p", "s"].copies == {"compared": 0, "shed": 0, "skipped": 0, "cancelled": 1}


async def test_a_request_the_shadow_would_refuse_is_not_copied() -> None:
    primary = _backend(65, tokenizer="t")
    shadow = _backend(65, tokenizer="other")
    service, agreement = _mirrored(primary, shadow)
    await collect(service.generate(_greedy(prompt=None, token_ids=pb.TokenIds(ids=[1, 2]))))
    assert shadow.requests == [] and agreement.pairs["p", "s"].copies["skipped"] == 1


async def test_a_share_of_requests_is_copied() -> None:
    primary, shadow = _backend(65), _backend(65)
    service, _ = _mirrored(primary, shadow, percent=25)
    for i in range(400):
        await collect(service.generate(_greedy(f"r{i}")))
    assert 60 < len(shadow.requests) < 140  # 100 expected; 4.6 sigma either side
