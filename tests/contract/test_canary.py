"""A split's canary over real gRPC, with mock engines whose timing and errors each test sets.

Steps are short (a fraction of a second, and a number of candidate requests), so each test runs in
seconds; the traffic is a few clients sending to the split until the canary ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from openengine_gateway import routes_pb
from openengine_gateway.client import EngineErrorEvent, OpenEngineClient, text_request
from openengine_gateway.config import AnalysisLimits, AnalysisSection, LatencyLimit, MirrorSection, SplitSection
from openengine_gateway.core.canary import Canary
from openengine_gateway.routes_cli import render
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.testing import RunningGateway, serve_backends
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import mock

PROMPT = "a prompt long enough that its prefill takes a while " * 3
"""With a request's 32-character id before it, about 190 tokens (the mock's are bytes): at 0.1 ms a token,
a first token after about 20 ms, mid-bucket of the TTFT histogram (0.01, 0.025], and half again as long lands
in the next one."""


@dataclass
class Canaried:
    running: RunningGateway
    client: OpenEngineClient

    @property
    def canary(self) -> Canary:
        return self.running.gateway.canaries.running["ab"]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The exporter's page as a scraper parses it, by (sample name, sorted labels)."""
        exporter = self.running.server.metrics
        assert exporter is not None
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(generate_latest(exporter.registry).decode())
            for sample in family.samples
        }

    def weights(self) -> dict[str, int]:
        route = self.running.gateway.routes.get("ab")
        assert route is not None
        return {engine.served_name: weight for engine, weight in zip(route.engines, route.weights, strict=True)}

    async def drive(self, until: Callable[[], bool], *, clients: int = 6, within_s: float = 60.0) -> Counter[str]:
        """Send greedy requests to the split from ``clients`` clients until ``until`` holds; what came back."""
        outcomes: Counter[str] = Counter()

        async def client() -> None:
            while not until():
                unique = uuid.uuid4().hex  # leads the prompt, so that no prefix of it is cached
                request = text_request(f"{unique} {PROMPT}", model="ab", request_id=unique, max_tokens=4, temperature=0)
                try:
                    await self.client.generate(request)
                    outcomes["finished"] += 1
                except EngineErrorEvent:
                    outcomes["engine error"] += 1

        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), within_s)
        return outcomes


@contextlib.asynccontextmanager
async def canaried(
    candidate: dict[str, Any],
    mirrors: list[MirrorSection] | None = None,
    baseline: dict[str, Any] | None = None,
    **analysis: Any,
) -> AsyncIterator[Canaried]:
    """Engines ``base`` and ``cand`` (mocks taking 0.1 ms a prompt token, ``candidate`` over that) split as
    ``ab`` with a canary of ``cand`` against ``base`` (``analysis`` over short steps)."""
    timing = {"seed": 1, "prefill_time_per_token_s": 0.0001, "decode_time_per_step_s": 0.001}
    section = AnalysisSection(
        baseline="base",
        candidate="cand",
        **{"steps": [25, 50, 100], "step_s": 0.3, "step_requests": 25, **analysis},
    )
    split = SplitSection(name="ab", engines={"base": 1, "cand": 1}, analysis=section)
    backends = [("base", mock(**{**timing, **(baseline or {})})), ("cand", mock(**{**timing, **candidate}))]
    async with (
        serve_backends(
            backends, splits=[split], mirrors=mirrors or [], server_options=ServerOptions(metrics_port=0)
        ) as running,
        await OpenEngineClient.connect(running.address) as client,
    ):
        yield Canaried(running, client)


# One client at a time for the latency limits: the mock prefills the requests it holds together, so with
# several clients the engine taking more of the traffic would be slower for that alone.
LATENCY = AnalysisLimits(ttft=LatencyLimit(percentile=90, max_ratio=1.2), itl=LatencyLimit(max_ratio=1.5))


async def test_an_equal_candidate_is_promoted_to_100(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "openengine_gateway.audit")
    async with canaried({}, limits=LATENCY) as served:
        assert served.weights() == {"base": 75, "cand": 25}  # the first step, whatever the file's weights
        outcomes = await served.drive(lambda: served.canary.done, clients=1)
        canary = served.canary
        assert canary.state == "promoted", canary.evidence
        assert served.weights() == {"base": 0, "cand": 100}
        table = await routes_pb.RoutesStub(served.client.channel).GetRoutes(routes_pb.GetRoutesRequest())
        page = served.metrics()
    assert outcomes == {"finished": sum(outcomes.values())}
    assert page["openengine_gateway_canary_weight", (("engine", "cand"), ("split", "ab"))] == 100
    assert page["openengine_gateway_canary_step", (("split", "ab"),)] == 2
    assert page["openengine_gateway_canary_state", (("split", "ab"), ("state", "promoted"))] == 1
    assert page["openengine_gateway_canary_state", (("split", "ab"), ("state", "running"))] == 0
    assert page["openengine_gateway_canary_decisions_total", (("decision", "promote"), ("split", "ab"))] == 1
    assert canary.decisions["step"] == 2 and canary.decisions["promote"] == 1  # started, 25 -> 50, promoted
    held = [line for line in canary.evidence if line.startswith("held at step 1 (cand 25%): TTFT p90")]
    assert len(held) == 1 and held[0].endswith("cand up to 50%")
    assert canary.evidence[-1].endswith("cand promoted to 100%")
    audits = [r.getMessage() for r in caplog.records if "canary of split 'ab'" in r.getMessage()]
    decided = [line for line in audits if "waits at" not in line]  # a step may wait for the baseline's share
    assert len(decided) == 3 and audits[-1].endswith("by the canary analysis")
    shown = render(table)
    assert "canary promoted: cand against base at 100%, steps 25, [50], 100" in shown
    assert "cand promoted to 100%" in shown


async def test_a_candidate_half_again_slower_to_its_first_token_is_rolled_back_at_the_first_step() -> None:
    async with canaried({"prefill_time_per_token_s": 0.00015}, limits=LATENCY) as served:
        outcomes = await served.drive(lambda: served.canary.done, clients=1)
        canary = served.canary
        assert served.weights() == {"base": 100, "cand": 0}
    assert canary.state == "rolled back" and canary.step == 0, canary.evidence
    line = canary.evidence[-1]
    assert line.startswith("rolled back at step 1 (cand 25%): TTFT p90: ") and "Mann-Whitney p=" in line
    assert "ITL" not in line.split(";")[0] and line.endswith("cand set to 0")
    assert outcomes == {"finished": sum(outcomes.values())}  # every request in flight at the rollback finished


async def test_a_candidate_failing_5_percent_of_requests_is_rolled_back_at_the_first_step() -> None:
    """The mock's faults are drawn from its seed: seed 2 fails 9 of its first 200 requests (4.5%)."""
    async with canaried({"seed": 2, "fault_rate": 0.05}, steps=[50, 100], step_requests=200) as served:
        outcomes = await served.drive(lambda: served.canary.done)
        canary = served.canary
        assert served.weights() == {"base": 100, "cand": 0}
    assert canary.state == "rolled back" and canary.step == 0, canary.evidence
    assert canary.evidence[-1].startswith("rolled back at step 1 (cand 50%): error rate: ")
    assert "vs 0/" in canary.evidence[-1] and ": fail" in canary.evidence[-1]
    assert outcomes["engine error"] >= 9


async def test_a_candidate_whose_greedy_outputs_diverge_is_rolled_back_when_agreement_is_a_limit() -> None:
    """A mirror copies what ``base`` answers to ``cand`` (the split's own engine as its shadow); other seeds,
    other greedy outputs."""
    mirror = MirrorSection(name="ab", shadow="cand", max_in_flight=64)
    limits = AnalysisLimits(agreement=0.9)
    async with canaried({"seed": 2}, [mirror], limits=limits) as served:
        await served.drive(lambda: served.canary.done)
        canary = served.canary
        assert served.weights() == {"base": 100, "cand": 0}
    assert canary.state == "rolled back", canary.evidence
    assert canary.evidence[-1].startswith("rolled back at step 1 (cand 25%): greedy agreement: 0.0% of ")
    assert "(minimum 90.0%): fail" in canary.evidence[-1]


async def test_too_little_traffic_waits_instead_of_deciding() -> None:
    async with canaried({}, step_requests=0, min_samples=20) as served:
        sent = 0

        def enough() -> bool:
            nonlocal sent
            sent += 1
            return sent > 12  # a dozen requests: a few for the candidate, under 20 on each side

        await served.drive(enough, clients=1)
        await asyncio.sleep(1.0)  # three steps' time
        canary = served.canary
        assert canary.state == "running" and canary.step == 0 and served.weights() == {"base": 75, "cand": 25}
    assert canary.decisions["wait"] == 1 and canary.evidence[-1].startswith("waits at step 1 (cand 25%) for traffic: ")
    assert "not enough data" in canary.evidence[-1] and "each side needs 20" in canary.evidence[-1]


async def test_an_operator_pauses_resumes_and_aborts_and_a_reload_keeps_or_pauses_it() -> None:
    async with canaried({}, step_s=3600) as served:
        stub = routes_pb.RoutesStub(served.client.channel)

        async def control(action: int, split: str = "ab") -> routes_pb.RouteTable:
            return await stub.ControlCanary(routes_pb.ControlCanaryRequest(split=split, action=action))

        table = await control(routes_pb.CANARY_ACTION_PAUSE)
        assert table.splits[0].canary.state == "paused"
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await control(routes_pb.CANARY_ACTION_PAUSE)
        assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await control(routes_pb.CANARY_ACTION_RESUME)).splits[0].canary.state == "running"
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await control(routes_pb.CANARY_ACTION_ABORT, split="nope")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await control(0)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        gateway, canary = served.running.gateway, served.canary
        split = gateway.routes.splits[0]
        assert split.analysis is not None
        gateway.reroute([split], [])  # the same analysis: the same canary, at its step
        assert served.canary is canary and served.weights() == {"base": 75, "cand": 25}
        paused = split.model_copy(update={"analysis": split.analysis.model_copy(update={"paused": True})})
        gateway.reroute([paused], [])
        assert served.canary is canary and canary.state == "paused" and canary.evidence[-1] == "paused by a reload"

        table = await control(routes_pb.CANARY_ACTION_ABORT)
        assert table.splits[0].canary.state == "aborted" and served.weights() == {"base": 100, "cand": 0}
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await control(routes_pb.CANARY_ACTION_PROMOTE)
        assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        gateway.reroute([SplitSection(name="ab", engines={"base": 1, "cand": 1})], [])  # removed: the file's weights
        assert gateway.canaries.running == {} and served.weights() == {"base": 1, "cand": 1}
