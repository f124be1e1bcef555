"""Mirrors over real gRPC: copies of one name's Generate requests streamed from a shadow mock engine.

The client is answered by its engine alone; these tests hold that a shadow that fails or lags changes
nothing for it, that copies past ``max_in_flight`` are shed and counted, that an Abort or a client
cancel reaches the copy, and that the agreement metrics scraped over HTTP match a comparison of the
two engines' outputs computed here from the same prompts sent to each engine by name.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.client import Completion, OpenEngineClient, Output
from openengine_gateway.config import MirrorSection
from openengine_gateway.core.agreement import DIVERGENCE_BUCKETS
from openengine_gateway.errors import EngineFailure
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.spi import EventStream, GenerationRequest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import STEP_S, mock
from .test_splits import Split, greedy, serve_split, split

METRICS = ServerOptions(metrics_port=0)
MIRROR = "openengine_gateway_mirror"


class Scrape:
    """One ``/metrics`` page: sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        """The sample's value, 0 when absent (a counter not yet written)."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def labelled(self, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of ``name`` whose labels include ``labels``: their other labels -> value."""
        return {
            tuple(pair for pair in key if pair[0] not in labels): value
            for (sample, key), value in self.samples.items()
            if sample == name and set(labels.items()) <= set(key)
        }


async def scrape(served: Split, ready: Callable[[Scrape], bool] = lambda _: True, within_s: float = 5.0) -> Scrape:
    """GET ``/metrics`` over HTTP until ``ready`` holds (a copy is counted when both its streams end)."""
    port = served.running.server.metrics_port

    def get() -> Scrape:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return Scrape(response.read().decode())

    deadline = time.monotonic() + within_s
    while not ready(page := await asyncio.to_thread(get)):
        assert time.monotonic() < deadline, "the metrics never reached the expected values"
        await asyncio.sleep(0.02)
    return page


def copies(page: Scrape, primary: str, shadow: str, outcome: str) -> float:
    return page(f"{MIRROR}_copies_total", primary=primary, shadow=shadow, outcome=outcome)


def mirror(name: str, shadow: str, **keys: Any) -> MirrorSection:
    return MirrorSection(name=name, shadow=shadow, **keys)


class BrokenShadow(MockBackend):
    """A mock engine whose every stream fails with INTERNAL 20 ms after it starts (mid-stream)."""

    def generate(self, request: GenerationRequest) -> EventStream:
        stream = super().generate(request)
        failure = EngineFailure(pb.ERROR_CODE_INTERNAL, "the shadow engine broke")
        asyncio.get_running_loop().call_later(0.02, stream.fail, failure)
        return stream


class CountingMock(MockBackend):
    """A mock engine that counts the generations it is asked for."""

    def __init__(self, settings: MockSettings) -> None:
        super().__init__(settings)
        self.generations = 0

    def generate(self, request: GenerationRequest) -> EventStream:
        self.generations += 1
        return super().generate(request)


async def timed(client: OpenEngineClient, request: pb.GenerateRequest) -> tuple[float, Completion]:
    start = time.perf_counter()
    completion = await client.generate(request)
    return time.perf_counter() - start, completion


async def test_a_failing_or_slow_shadow_leaves_the_primary_unchanged() -> None:
    backends = {
        "a": mock(seed=1),
        "broken": BrokenShadow(MockSettings(seed=2, decode_time_per_step_s=STEP_S)),
        "slow": mock(seed=2, decode_time_per_step_s=10 * STEP_S),
    }
    modes = {"off": [], "broken": [mirror("a", "broken")], "slow": [mirror("a", "slow")]}
    latencies: dict[str, list[float]] = defaultdict(list)
    outputs: set[tuple[tuple[int, ...], int]] = set()
    rounds, batch = 8, 4
    async with serve_split(backends, server_options=METRICS) as served:
        for turn in range(rounds):  # alternating, in a different order each round, so drift hits every mode
            order = list(modes)[turn % 3 :] + list(modes)[: turn % 3]
            for mode in order:
                served.running.gateway.reroute([], modes[mode])
                requests = [greedy("a", max_tokens=20, ignore_eos=True) for _ in range(batch)]
                for elapsed, completion in await asyncio.gather(*(timed(served.client, r) for r in requests)):
                    latencies[mode].append(elapsed)
                    output = completion.outputs[0]
                    outputs.add((tuple(output.token_ids), output.finish_reason))
        page = await scrape(served, lambda page: copies(page, "a", "broken", "compared") == rounds * batch)
    base = statistics.median(latencies["off"])
    ratios = {mode: statistics.median(latencies[mode]) / base for mode in ("broken", "slow")}
    print(f"primary latency, median of {rounds * batch}: without a mirror {base * 1000:.1f} ms; ratios {ratios}")
    assert all(ratio < 1.5 for ratio in ratios.values()), ratios
    assert len(outputs) == 1 and next(iter(outputs))[1] == pb.FINISH_REASON_LENGTH  # the same answer every time
    errors = page.labelled(f"{MIRROR}_errors_total", primary="a", shadow="broken")
    assert errors == {(("code", "INTERNAL"), ("side", "shadow")): rounds * batch}


async def test_copies_past_max_in_flight_are_shed_and_counted() -> None:
    backends = {"a": mock(seed=1), "slow": mock(seed=2, decode_time_per_step_s=0.1)}
    async with serve_split(backends, mirrors=[mirror("a", "slow", max_in_flight=2)], server_options=METRICS) as served:
        completions = await asyncio.gather(
            *(served.client.generate(greedy("a", max_tokens=10, ignore_eos=True)) for _ in range(10))
        )
        shed = await scrape(served)
        done = await scrape(served, lambda page: copies(page, "a", "slow", "compared") == 2)
    assert [len(c.outputs[0].tokens) for c in completions] == [10] * 10
    assert copies(shed, "a", "slow", "shed") == 8 and copies(shed, "a", "slow", "compared") == 0
    assert copies(done, "a", "slow", "shed") == 8


async def test_max_in_flight_bounds_a_mirrored_split_as_a_whole() -> None:
    """Five requests reach each engine of a split mirrored with ``max_in_flight=2``: two copies in all."""
    backends = {"a": mock(seed=1), "b": mock(seed=2), "slow": mock(seed=3, decode_time_per_step_s=0.1)}
    mirrors = [mirror("ab", "slow", max_in_flight=2)]
    async with serve_split(backends, [split({"a": 1, "b": 1})], mirrors, server_options=METRICS) as served:
        route = served.running.gateway.routes.get("ab")
        assert route is not None
        sessions: dict[str, list[str]] = {"a": [], "b": []}
        for key in (f"session-{i}" for i in range(100)):
            engine = route.pick(metadata={"session": key}).served_name
            if len(sessions[engine]) < 5:
                sessions[engine].append(key)
        requests = [
            greedy("ab", max_tokens=10, ignore_eos=True, metadata={"session": key})
            for keys in sessions.values()
            for key in keys
        ]
        await asyncio.gather(*(served.client.generate(request) for request in requests))
        page = await scrape(served)
    shed = {engine: copies(page, engine, "slow", "shed") for engine in ("a", "b")}
    assert sum(shed.values()) == 8, shed  # the mirror's two copies at once, whichever engine answered


async def test_a_share_of_requests_is_copied() -> None:
    shadow = CountingMock(MockSettings(seed=2))
    n, share = 400, 0.25
    backends = {"a": mock(seed=1, decode_time_per_step_s=0.0), "b": shadow}
    async with serve_split(backends, mirrors=[mirror("a", "b", percent=100 * share)], server_options=METRICS) as served:
        for _ in range(n // 100):
            await asyncio.gather(*(served.client.generate(greedy("a", max_tokens=1)) for _ in range(100)))
        await scrape(served, lambda page: copies(page, "a", "b", "compared") == shadow.generations)
    assert abs(shadow.generations - n * share) <= 4 * math.sqrt(n * share * (1 - share)), shadow.generations


async def test_a_copy_the_shadow_would_refuse_is_skipped() -> None:
    backends = {"a": mock(seed=1), "short": mock(seed=2, max_output_tokens=8)}
    async with serve_split(backends, mirrors=[mirror("a", "short")], server_options=METRICS) as served:
        completion = await served.client.generate(greedy("a", max_tokens=16, ignore_eos=True))
        skipped = await scrape(served)
        await served.client.generate(greedy("a", max_tokens=4, ignore_eos=True))
        compared = await scrape(served, lambda page: copies(page, "a", "short", "compared") == 1)
    assert len(completion.outputs[0].tokens) == 16
    assert copies(skipped, "a", "short", "skipped") == 1 and copies(compared, "a", "short", "skipped") == 1


async def test_abort_and_client_cancel_reach_the_shadow_copy() -> None:
    backends = {"a": mock(seed=1), "b": mock(seed=2)}
    async with serve_split(backends, mirrors=[mirror("a", "b")], server_options=METRICS) as served:
        ends = []
        for how in ("Abort", "cancel"):
            request = greedy("a", max_tokens=1000, ignore_eos=True)  # five seconds unless stopped
            call = served.running.stub.Generate(request)
            stream = aiter(call)
            await anext(stream)
            await _until(served, lambda running: running == {"a": 1, "b": 1})
            if how == "Abort":
                aborted = await served.client.abort(pb.AbortRequest(request_id=request.request_id))
                assert aborted.status == pb.ABORT_STATUS_ABORTED
                ends.append([message async for message in stream][-1].finished.reason)
            else:
                call.cancel()
            await _until(served, lambda running: running == {"a": 0, "b": 0}, within_s=1.0)
        page = await scrape(served, lambda page: copies(page, "a", "b", "cancelled") == 2)
    assert ends == [pb.FINISH_REASON_CANCELLED] and copies(page, "a", "b", "compared") == 0


async def _until(served: Split, condition: Callable[[dict[str, int]], bool], within_s: float = 2.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition(running := await served.running_requests()):
        assert time.monotonic() < deadline, f"engines running: {running}"
        await asyncio.sleep(0.01)


def first_difference(primary: list[int], shadow: list[int]) -> int | None:
    """Where two outputs first differ; the shorter length when one is a prefix of the other."""
    for position, (ours, theirs) in enumerate(zip(primary, shadow, strict=False)):
        if ours != theirs:
            return position
    return None if len(primary) == len(shadow) else min(len(primary), len(shadow))


@dataclass
class ByHand:
    """The comparison of two engines' answers to the same requests, computed here."""

    identical: int = 0
    positions: list[int] = field(default_factory=list)
    """First divergence position of each diverged output."""
    finishes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(primary, shadow) finish reason names -> outputs."""

    def add(self, ours: Output, theirs: Output) -> None:
        position = first_difference(ours.token_ids, theirs.token_ids)
        if position is None:
            self.identical += 1
        else:
            self.positions.append(position)
        self.finishes[_reason(ours), _reason(theirs)] += 1

    def check(self, page: Scrape, primary: str, shadow: str) -> None:
        """The scraped agreement metrics of the pair say exactly this."""
        pair = {"primary": primary, "shadow": shadow}
        outputs = page.labelled(f"{MIRROR}_outputs_total", **pair, basis="tokens")
        assert outputs == {(("result", "diverged"),): len(self.positions), (("result", "identical"),): self.identical}
        buckets = page.labelled(f"{MIRROR}_divergence_position_bucket", **pair, basis="tokens")
        by_bound = {float(dict(labels)["le"]): count for labels, count in buckets.items()}
        assert len(by_bound) == len(DIVERGENCE_BUCKETS) + 1  # and +Inf
        assert by_bound == {bound: sum(p <= bound for p in self.positions) for bound in by_bound}
        assert page(f"{MIRROR}_divergence_position_sum", **pair, basis="tokens") == sum(self.positions)
        finishes = page.labelled(f"{MIRROR}_finish_reasons_total", **pair)
        assert finishes == {
            (("primary_reason", ours), ("shadow_reason", theirs)): count
            for (ours, theirs), count in self.finishes.items()
        }
        compared = copies(page, primary, shadow, "compared")
        assert compared == self.identical + len(self.positions)
        assert page(f"{MIRROR}_time_to_first_token_seconds_count", **pair, side="shadow") == compared


def _reason(output: Output) -> str:
    return pb.FinishReason.Name(output.finish_reason).removeprefix("FINISH_REASON_")


async def test_agreement_metrics_match_a_hand_computed_comparison() -> None:
    """``b`` differs from ``a`` by its seed; ``c`` has ``a``'s seed but a 40-token context, so a request
    without max_tokens stops earlier on it: the same tokens, one side a prefix of the other."""
    backends = {
        "a": mock(seed=1, decode_time_per_step_s=0.0, max_output_tokens=48),
        "b": mock(seed=2, decode_time_per_step_s=0.0),
        "c": mock(seed=1, decode_time_per_step_s=0.0, max_context_length=40, max_output_tokens=39),
    }
    prompts = [f"{word} " * repeat for word in ("tea", "hi yo", "z") for repeat in (1, 2, 3)]
    phases: dict[str, list[dict[str, Any]]] = {
        "b": [{"max_tokens": 24}],
        "c": [{"max_tokens": 12}, {"ignore_eos": True}, {}],
    }
    results: dict[str, tuple[ByHand, Scrape]] = {}
    async with serve_split(backends, server_options=METRICS) as served:

        async def answers(model: str, cases: list[tuple[str, dict[str, Any]]]) -> list[Output]:
            completions = await asyncio.gather(*(served.client.generate(greedy(model, p, **o)) for p, o in cases))
            return [completion.outputs[0] for completion in completions]

        for shadow, option_sets in phases.items():
            cases = [(prompt, options) for prompt in prompts for options in option_sets]
            by_hand = ByHand()
            primary = await answers("a", cases)
            for ours, theirs in zip(primary, await answers(shadow, cases), strict=True):
                by_hand.add(ours, theirs)
            served.running.gateway.reroute([], [mirror("a", shadow)])
            assert [o.token_ids for o in await answers("a", cases)] == [o.token_ids for o in primary]
            counted = len(cases)
            page = await scrape(served, lambda page, s=shadow, n=counted: copies(page, "a", s, "compared") == n)
            results[shadow] = (by_hand, page)
    print(
        {shadow: (hand.identical, sorted(hand.positions), dict(hand.finishes)) for shadow, (hand, _) in results.items()}
    )
    assert results["b"][0].positions and results["c"][0].identical
    assert any(position > 0 for position in results["c"][0].positions)
    for shadow, (by_hand, page) in results.items():
        by_hand.check(page, "a", shadow)
