"""Kit rules that need a request still in flight decide from the gateway, not from when their client read it.

A client kept off the CPU (CI saw seconds of it on 2 cores beside vLLM's CPU engine) can read an answer
before the last messages of a stream that had already ended. ``drain.waits-for-in-flight`` and
``generate.duplicate-request-id`` then ask the gateway with an Abort: a gateway that breaks the rule
still fails it, and one that does not is not failed by the client's lateness.
"""

from __future__ import annotations

import asyncio

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.conformance import Outcome, Rule, all_rules, in_process_target, run_rule
from openengine_gateway.conformance.observe import OpenCall, Stream
from openengine_gateway.core.lifecycle import LifecycleService
from openengine_gateway.core.registry import ActiveRequest, RequestRegistry

DRAIN, DUPLICATE = (
    next(r for r in all_rules() if r.id == i) for i in ("drain.waits-for-in-flight", "generate.duplicate-request-id")
)


async def outcome(rule: Rule, **settings: float) -> tuple[Outcome, str]:
    async with in_process_target(MockBackend(MockSettings(**settings)), timeout_s=30) as target:
        result = await run_rule(rule, target)
    return result.outcome, result.message


@pytest.fixture
def client_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's client stalls for a second after a stream's first response: a zero-cost engine ends
    the long request meanwhile, and the check reads the stream's end only after its next answer."""
    read_first = OpenCall.first

    async def first_then_off_the_cpu(self: OpenCall) -> pb.GenerateResponse:
        first = await read_first(self)
        await asyncio.sleep(1.0)
        return first

    monkeypatch.setattr(OpenCall, "first", first_then_off_the_cpu)


async def test_a_drain_that_counts_no_request_in_flight_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing_in_flight(self: LifecycleService) -> tuple[int, int | None]:
        return 0, None

    monkeypatch.setattr(LifecycleService, "_counts", nothing_in_flight)
    found, message = await outcome(DRAIN, decode_time_per_step_s=0.002)
    assert found is Outcome.FAILED and "an Abort found it running" in message, message


async def test_a_drain_after_the_request_ended_unread_is_not_a_failure(
    client_off_the_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_rest = OpenCall.rest

    async def rest_read_late(self: OpenCall) -> Stream:
        await asyncio.sleep(0.5)  # after the drain's STARTED
        return await read_rest(self)

    monkeypatch.setattr(OpenCall, "rest", rest_read_late)
    found, message = await outcome(DRAIN)
    assert found is Outcome.NOT_APPLICABLE and "ended about when the drain started" in message, message


async def test_a_gateway_that_admits_an_in_flight_id_twice_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    admit = RequestRegistry.admit

    def admit_twice(self: RequestRegistry, request: ActiveRequest) -> None:
        if self.get(request.request_id) is None:  # the duplicate runs untracked; the first keeps its id
            admit(self, request)

    monkeypatch.setattr(RequestRegistry, "admit", admit_twice)
    found, message = await outcome(DUPLICATE, decode_time_per_step_s=0.002)
    assert found is Outcome.FAILED and "the request was accepted" in message, message


async def test_a_duplicate_after_the_request_ended_unread_is_not_a_failure(client_off_the_cpu: None) -> None:
    found, message = await outcome(DUPLICATE)
    assert found is Outcome.NOT_APPLICABLE and "ended about when its duplicate arrived" in message, message
