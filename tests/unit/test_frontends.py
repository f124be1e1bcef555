"""``--frontends``: the refusal of a backend that cannot be shared, the SPI hook, the merged metrics page, and a
frontend outliving its supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from openengine_gateway import cli, pb
from openengine_gateway.core.gateway import Gateway
from openengine_gateway.frontends import watch_supervisor
from openengine_gateway.server.merged_metrics import merge_pages
from openengine_gateway.server.metrics import MetricsExporter
from openengine_gateway.spi import Backend, BackendSettings, ConfigurationError, Load, SharedEngine
from prometheus_client import generate_latest

from tests.fakes import FakeBackend, engine_set


def test_a_backend_that_cannot_be_shared_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--backend", "mock", "--frontends", "2", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert "backend 'mock' cannot serve from several frontend processes (--frontends 2)" in error


def test_frontends_is_at_least_one() -> None:
    assert cli.main(["--backend", "mock", "--frontends", "0"]) == 2


class _Shared(SharedEngine):
    attachments = ("first", "second")

    def stop(self) -> None:
        return None


class _Shareable(FakeBackend):
    @classmethod
    def share(cls, settings: BackendSettings, frontends: int) -> SharedEngine:
        return _Shared()


def test_a_driver_shares_by_overriding_share() -> None:
    assert not FakeBackend.can_share() and _Shareable.can_share()
    with pytest.raises(ConfigurationError, match="cannot serve from several frontend processes"):
        FakeBackend.share(BackendSettings(), 2)
    with pytest.raises(ConfigurationError):
        FakeBackend().attach("first")
    assert list(_Shareable.share(BackendSettings(), 2).attachments) == ["first", "second"]
    assert Backend.can_share() is False


def page(requests: int, running: int, stamp: int | None, *, serving: bool) -> dict[str, object]:
    """One frontend's ``Metrics`` answer, from a real exporter over a gateway on a fake engine."""
    gateway = Gateway(engine_set(FakeBackend()))
    exporter = MetricsExporter(gateway)
    for _ in range(requests):
        exporter.rpc_finished("Generate", "OK")
    gateway.monitor.load["m"] = Load(timestamp_unix_nanos=stamp, running_requests=running)
    gateway.monitor.health["m"] = pb.HEALTH_STATE_READY
    gateway.state.started = serving
    exposition = generate_latest(exporter.registry).decode()
    return {"exposition": exposition, "load_timestamps": {"m": stamp}}


def samples(pages: list[dict[str, object]]) -> dict[tuple[str, str], float]:
    return {
        (sample.name, json.dumps(sample.labels, sort_keys=True)): sample.value
        for family in merge_pages(pages)
        for sample in family.samples
    }


def test_the_merged_page_sums_calls_and_takes_the_engine_from_the_freshest_process() -> None:
    merged = samples([page(2, 7, 10, serving=True), page(3, 0, 20, serving=False)])
    assert merged[("openengine_gateway_requests_total", '{"code": "OK", "rpc": "Generate"}')] == 5
    assert merged[("openengine_gateway_engine_running_requests", '{"model": "m"}')] == 0
    assert merged[("openengine_gateway_engine_health", '{"model": "m", "state": "READY"}')] == 1
    assert merged[("openengine_gateway_serving", "{}")] == 0
    assert merged[("openengine_gateway_time_to_first_token_seconds_count", "{}")] == 0


def test_an_unstamped_load_counts_as_oldest() -> None:
    merged = samples([page(0, 4, None, serving=True), page(0, 1, 5, serving=True)])
    assert merged[("openengine_gateway_engine_running_requests", '{"model": "m"}')] == 1
    assert merged[("openengine_gateway_serving", "{}")] == 1


def _frontend(stopped: Path) -> None:
    """A frontend's loop until ``watch_supervisor`` says the supervisor is gone; then it notes so (a
    supervisor already gone when the watch begins counts alike)."""

    async def until_supervisor_gone() -> None:
        gone = asyncio.Event()
        watch_supervisor(gone.set)
        await gone.wait()

    stopped.with_suffix(".serving").write_text(str(os.getpid()))
    asyncio.run(until_supervisor_gone())
    stopped.write_text("stopped")


def _supervisor(stopped: Path) -> None:
    frontend = multiprocessing.get_context("spawn").Process(target=_frontend, args=(stopped,))
    frontend.start()
    frontend.join()


def test_a_frontend_stops_when_its_supervisor_is_killed(tmp_path: Path) -> None:
    stopped = tmp_path / "frontend"
    supervisor = multiprocessing.get_context("spawn").Process(target=_supervisor, args=(stopped,))
    supervisor.start()
    try:
        assert wait_for(stopped.with_suffix(".serving").exists), "the frontend never started"
        assert not stopped.exists()
        os.kill(supervisor.pid or 0, signal.SIGKILL)  # no chance to stop its frontends itself
        assert wait_for(stopped.exists), "the frontend kept serving without its supervisor"
    finally:
        supervisor.kill()
        supervisor.join()
        if not stopped.exists() and stopped.with_suffix(".serving").exists():  # the orphan this test proves absent
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stopped.with_suffix(".serving").read_text()), signal.SIGKILL)


def wait_for(condition: Callable[[], bool], within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
