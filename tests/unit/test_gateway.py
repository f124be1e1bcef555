"""``core.gateway``, ``core.state`` and ``core.background``: composing and stopping the core."""

from __future__ import annotations

import asyncio
import logging

import pytest
from openengine_gateway import pb
from openengine_gateway.core.background import BackgroundTasks
from openengine_gateway.core.gateway import Gateway, GatewayOptions
from openengine_gateway.core.registry import ActiveRequest
from openengine_gateway.core.state import GatewayState
from openengine_gateway.errors import ResourceExhausted, Unavailable

from tests.fakes import FakeBackend, engine_set


def test_state_admission() -> None:
    state = GatewayState()
    with pytest.raises(Unavailable, match="starting") as raised:
        state.check_accepting()
    assert raised.value.retry_after_ms is not None
    state.started = True
    state.check_accepting()
    state.draining = True
    with pytest.raises(Unavailable, match="draining"):
        state.check_accepting()


async def test_background_tasks_are_held_and_failures_logged(caplog: pytest.LogCaptureFixture) -> None:
    background = BackgroundTasks()

    async def fail() -> None:
        raise RuntimeError("abort failed")

    gate = asyncio.Event()
    background.spawn(fail(), "abort r1")
    blocked = background.spawn(gate.wait(), "blocked")
    assert len(background) == 2
    with caplog.at_level(logging.ERROR):
        await background.wait(0.05)
    assert len(background) == 1
    assert "background task 'abort r1' failed" in caplog.text
    background.cancel_all()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert len(background) == 0


def test_instance_id() -> None:
    assert Gateway(engine_set(FakeBackend(instance_id="engine-1"))).discovery.engine_info().instance_id == "engine-1"
    configured = Gateway(engine_set(FakeBackend(instance_id="engine-1")), GatewayOptions(instance_id="gw"))
    assert configured.discovery.engine_info().instance_id == "gw"
    several = Gateway(engine_set((FakeBackend(instance_id="x"), "a"), (FakeBackend(instance_id="x"), "b")))
    assert several.discovery.engine_info().instance_id not in ("", "x")


def test_options_reach_the_services() -> None:
    gateway = Gateway(
        engine_set(FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))),
        GatewayOptions(max_in_flight=1, finished_window=1, kv_replay_batches=2, subscriber_queue=3),
    )
    gateway.registry.admit(ActiveRequest("a", "generate", "m"))
    with pytest.raises(ResourceExhausted, match="limit of 1"):
        gateway.registry.admit(ActiveRequest("b", "generate", "m"))
    assert gateway.events.kv.ranks == [0, 1]


async def test_settle_waits_then_aborts_and_ends_subscriptions() -> None:
    gateway = Gateway(engine_set(FakeBackend(publishes_runtime_events=True)))
    gateway.start()
    assert gateway.state.started
    quick, slow = ActiveRequest("quick", "generate", "m"), ActiveRequest("slow", "generate", "m")
    reasons: list[str] = []
    slow.stop = reasons.append
    gateway.registry.admit(quick)
    gateway.registry.admit(slow)
    subscription = gateway.events.runtime.subscribe([])
    asyncio.get_running_loop().call_soon(gateway.registry.release, quick)  # finishes while settle waits
    await gateway.settle(0.05)
    assert gateway.state.draining
    assert not quick.aborted and slow.aborted and reasons == ["the gateway is shutting down"]
    final = await asyncio.wait_for(anext(subscription), 1)
    assert final.error.code == pb.ERROR_CODE_DRAINING
    gateway.background.cancel_all()


async def test_stop_stops_every_engine_even_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    failing, healthy = FakeBackend(), FakeBackend()

    async def broken_stop() -> None:
        raise RuntimeError("engine hung")

    failing.stop = broken_stop  # type: ignore[method-assign]
    gateway = Gateway(engine_set((failing, "a"), (healthy, "b")))
    gateway.start()
    with caplog.at_level(logging.ERROR):
        await gateway.stop()
    assert healthy.stopped
    assert "stopping a failed" in caplog.text
