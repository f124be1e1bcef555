"""A split name over real gRPC: two mock engines behind one name (``[[splits]]``).

The client cannot see which engine answered, so the tests tell them apart the way a client could:
the engines have different seeds, so the same greedy prompt gives each its own first token, learnt
by sending it to each engine by its own name first.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.client import OpenEngineClient, StatusError, text_request
from openengine_gateway.config import MirrorSection, SplitSection
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.testing import RunningGateway, serve_backends

from .conftest import mock

PROMPT = "Which engine answers?"


def greedy(
    model: str,
    prompt: str | Sequence[int] = PROMPT,
    *,
    metadata: Mapping[str, str] | None = None,
    lora_name: str = "",
    **options: Any,
) -> pb.GenerateRequest:
    """A greedy Generate request with a fresh id (``options``: ``text_request``'s flat options)."""
    request = text_request(prompt, model=model, request_id=uuid.uuid4().hex, temperature=0.0, **options)
    request.metadata.update(metadata or {})
    request.lora_name = lora_name
    return request


@dataclass
class Split:
    """Mock engines and a gateway serving them, with a connected client."""

    backends: dict[str, MockBackend]
    running: RunningGateway
    client: OpenEngineClient

    async def first_tokens(self, prompt: str = PROMPT, **options: Any) -> dict[int, str]:
        """Each engine's first greedy token for ``prompt`` (sent to it by name) -> the engine; they must differ."""
        tokens = {}
        for name in self.backends:
            completion = await self.client.generate(greedy(name, prompt, max_tokens=1, **options))
            tokens[completion.outputs[0].token_ids[0]] = name
        assert len(tokens) == len(self.backends), f"the engines agree on {prompt!r}: pick another prompt or seed"
        return tokens

    async def engines_of(self, requests: Sequence[pb.GenerateRequest], batch: int = 250) -> list[str]:
        """Which engine answered each request (by its first token, ``first_tokens`` of the requests' prompt)."""
        signature = await self.first_tokens(requests[0].prompt)
        engines: list[str] = []
        for start in range(0, len(requests), batch):
            chunk = requests[start : start + batch]
            completions = await asyncio.gather(*(self.client.generate(request) for request in chunk))
            engines.extend(signature[completion.outputs[0].token_ids[0]] for completion in completions)
        return engines

    async def running_requests(self) -> dict[str, int]:
        """What each engine itself reports running now."""
        return {name: (await backend.load()).running_requests or 0 for name, backend in self.backends.items()}

    async def idle(self, within_s: float = 2.0) -> None:
        """Wait until no engine runs a request (an abort reaches a driver in the background)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while any((await self.running_requests()).values()):
            assert loop.time() < deadline, f"engines still running: {await self.running_requests()}"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serve_split(
    backends: Mapping[str, MockBackend],
    splits: Sequence[SplitSection] = (),
    mirrors: Sequence[MirrorSection] = (),
    *,
    server_options: ServerOptions | None = None,
) -> AsyncIterator[Split]:
    """Serve ``backends`` under their names, with ``splits`` and ``mirrors``; stopped on exit."""
    entries = [(name, backend) for name, backend in backends.items()]
    async with (
        serve_backends(entries, splits=splits, mirrors=mirrors, server_options=server_options) as running,
        await OpenEngineClient.connect(running.address) as client,
    ):
        yield Split(dict(backends), running, client)


def split(weights: Mapping[str, int], name: str = "ab", **keys: Any) -> SplitSection:
    return SplitSection(name=name, engines=dict(weights), **keys)


def two_mocks(**settings: Any) -> dict[str, MockBackend]:
    """Engines ``a`` and ``b``: the same mock but for its seed."""
    return {"a": mock(seed=1, **settings), "b": mock(seed=2, **settings)}


async def test_weights_hold_over_2000_requests() -> None:
    async with serve_split(two_mocks(decode_time_per_step_s=0.0), [split({"a": 80, "b": 20})]) as served:
        engines = await served.engines_of([greedy("ab", max_tokens=1) for _ in range(2000)])
    counts, n, p = Counter(engines), 2000, 0.8
    sigma = math.sqrt(n * p * (1 - p))
    print(f"80/20 split over {n} requests: {dict(counts)} (4 sigma = {4 * sigma:.0f})")
    assert abs(counts["a"] - n * p) <= 4 * sigma and counts["a"] + counts["b"] == n


async def test_a_sticky_key_keeps_its_engine_and_keys_spread_over_both() -> None:
    sessions = [f"conversation-{i}" for i in range(24)]
    async with serve_split(two_mocks(decode_time_per_step_s=0.0), [split({"a": 1, "b": 1})]) as served:
        by_source: dict[str, dict[str, set[str]]] = {}
        for source, keyed in (
            ("metadata.session", lambda key: greedy("ab", max_tokens=1, metadata={"session": key})),
            ("cache_salt", lambda key: greedy("ab", max_tokens=1, cache_salt=key)),
        ):
            requests = [(key, keyed(key)) for key in sessions for _ in range(4)]
            engines = await served.engines_of([request for _, request in requests])
            reached: dict[str, set[str]] = defaultdict(set)
            for (key, _), engine in zip(requests, engines, strict=True):
                reached[key].add(engine)
            by_source[source] = reached
        served.running.gateway.reroute([split({"a": 1, "b": 1}, sticky=[])], [])
        unsticky = await served.engines_of([greedy("ab", max_tokens=1, metadata={"session": "one"}) for _ in range(40)])
    for source, reached in by_source.items():
        assert all(len(engines) == 1 for engines in reached.values()), (source, dict(reached))
        assert set.union(*reached.values()) == {"a", "b"}, source
    assert set(unsticky) == {"a", "b"}  # without sticky sources the session key is only metadata


LIMITED: dict[str, Any] = {
    "max_context_length": 1024,
    "max_output_tokens": 512,
    "max_top_n": 5,
    "max_num_sequences": 4,
    "max_running_requests": 32,
    "guided_decoding_modes": ("regex",),
    "enable_embed": False,
}
"""Engine ``a``: smaller limits, one guided mode, no Embed; ``b`` keeps the mock's defaults but Score."""


def at_limits(model: str) -> pb.GenerateRequest:
    """A request at every limit of the LIMITED engine (and so of the split)."""
    request = greedy(model, "Count:", max_tokens=512, num_sequences=4, ignore_eos=True, return_output_logprobs=True)
    request.response.output_candidates.top_n = 5
    request.guided.regex = "[0-9 ]+"
    return request


def beyond_limits(model: str) -> dict[str, pb.GenerateRequest]:
    """Requests past one of the LIMITED engine's limits each, all within ``b``'s."""
    cases = {
        "max_tokens": greedy(model, max_tokens=513),
        "num_sequences": greedy(model, max_tokens=1, num_sequences=5),
        "top_n": greedy(model, max_tokens=1, return_output_logprobs=True),
        "guided choice": greedy(model, max_tokens=4),
    }
    cases["top_n"].response.output_candidates.top_n = 6
    cases["guided choice"].guided.choice.choices.extend(["yes", "no"])
    return cases


def embed(model: str) -> pb.EmbedRequest:
    request = pb.EmbedRequest(context=pb.TaskRequestContext(request_id=uuid.uuid4().hex, model=model))
    request.inputs.add(item_id="only", text="embed me")
    return request


def score(model: str) -> pb.ScoreRequest:
    request = pb.ScoreRequest(context=pb.TaskRequestContext(request_id=uuid.uuid4().hex, model=model))
    group = request.groups.add(group_id="g", query=pb.TaskInput(item_id="q", text="query"))
    group.candidates.add(item_id="c", text="candidate")
    return request


async def status_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(StatusError) as refused:
        await call
    return refused.value.code


async def test_a_split_advertises_and_enforces_what_every_engine_accepts() -> None:
    backends = {
        "a": mock(seed=1, decode_time_per_step_s=0.0, **LIMITED),
        "b": mock(seed=2, decode_time_per_step_s=0.0, enable_score=False),
    }
    async with serve_split(backends, [split({"a": 1, "b": 1})]) as served:
        client = served.client
        info = await client.model_info("ab")
        alone = {name: await client.model_info(name) for name in backends}
        for model in ("a", "b", "ab"):  # valid for the split: valid on each engine, by its own name too
            completion = await client.generate(at_limits(model))
            assert all(o.tokens and o.finish_reason != pb.FINISH_REASON_UNSPECIFIED for o in completion.outputs)
            assert len(completion.outputs) == 4 and len(completion.outputs[0].tokens[0].candidates) == 5
        refused = {case: await status_of(client.generate(r)) for case, r in beyond_limits("ab").items()}
        for case, request in beyond_limits("b").items():  # engine b would have taken each
            assert (await client.generate(request)).outputs, case
        embed_codes = [await status_of(client.embed(embed(model))) for model in ("ab", "a")]
        score_codes = [await status_of(client.score(score(model))) for model in ("ab", "b")]
        await client.embed(embed("b"))
        await client.score(score("a"))
        token_ids = await client.generate(greedy("ab", [72, 105, 33], max_tokens=2))  # one tokenizer: ids pass
    generation = info.generation
    assert (info.served_model_name, info.max_context_length, info.max_output_tokens) == ("ab", 1024, 512)
    assert info.max_running_requests == 32 and info.supports_token_ids_input
    assert (generation.output_logprobs.max_top_n, generation.prompt_logprobs.max_top_n) == (5, 5)
    assert generation.max_num_sequences == 4
    assert list(generation.guided_decoding.modes) == [pb.GUIDED_DECODING_MODE_REGEX]
    assert list(alone["b"].generation.guided_decoding.modes) == [
        pb.GUIDED_DECODING_MODE_REGEX,
        pb.GUIDED_DECODING_MODE_CHOICE,
    ]
    assert not info.tasks.embed.supported and not info.tasks.score.supported and info.tasks.classify.supported
    assert alone["b"].tasks.embed.supported and alone["a"].tasks.score.supported
    assert refused == dict.fromkeys(refused, grpc.StatusCode.INVALID_ARGUMENT)
    assert embed_codes[0] == embed_codes[1] and score_codes[0] == score_codes[1]  # refused as the engine lacking it
    assert len(token_ids.outputs[0].tokens) == 2


async def test_abort_finds_a_split_request_on_whichever_engine_took_it() -> None:
    async with serve_split(two_mocks(), [split({"a": 1, "b": 1})]) as served:
        signature = await served.first_tokens()
        requests = [greedy("ab", max_tokens=1000, ignore_eos=True) for _ in range(8)]
        calls = [served.running.stub.Generate(request) for request in requests]
        streams = [aiter(call) for call in calls]
        firsts = [await anext(stream) for stream in streams]
        took = {signature[first.token.tokens[0].token_id] for first in firsts}
        running = await served.running_requests()
        aborted = [await served.client.abort(pb.AbortRequest(request_id=r.request_id)) for r in requests]
        ends = [[message async for message in stream][-1] for stream in streams]
        await served.idle(within_s=1.0)
    assert took == {"a", "b"} and sum(running.values()) == 8
    assert [outcome.status for outcome in aborted] == [pb.ABORT_STATUS_ABORTED] * 8
    assert [end.finished.reason for end in ends] == [pb.FINISH_REASON_CANCELLED] * 8


async def test_drain_completes_with_split_requests_in_flight() -> None:
    async with serve_split(two_mocks(), [split({"a": 1, "b": 1})]) as served:
        requests = [greedy("ab", max_tokens=40, ignore_eos=True) for _ in range(6)]
        calls = [aiter(served.running.stub.Generate(request)) for request in requests]
        for call in calls:
            await anext(call)
        drained = [response async for response in served.client.drain(pb.DrainRequest(), timeout_s=10)]
        ends = [[message async for message in call][-1] for call in calls]
    assert drained[0].state == pb.DRAIN_STATE_STARTED and drained[0].in_flight_requests == 6
    assert drained[-1].state == pb.DRAIN_STATE_COMPLETE and drained[-1].in_flight_requests == 0
    assert [end.finished.reason for end in ends] == [pb.FINISH_REASON_LENGTH] * 6


async def test_a_lora_loaded_is_usable_through_the_split(tmp_path: Path) -> None:
    async with serve_split(two_mocks(decode_time_per_step_s=0.0), [split({"a": 1, "b": 1})]) as served:
        base = await served.first_tokens()
        await served.client.load_lora(pb.LoraAdapter(lora_id=1, lora_name="style", source_path=str(tmp_path)))
        adapted = await served.first_tokens(lora_name="style")
        completions = await asyncio.gather(
            *(served.client.generate(greedy("ab", max_tokens=1, lora_name="style")) for _ in range(40))
        )
    reached = Counter(adapted[c.outputs[0].token_ids[0]] for c in completions)  # KeyError: not the adapter's token
    assert set(reached) == {"a", "b"} and not set(adapted) & set(base)


async def test_reroute_mid_traffic_leaves_running_requests_on_their_engine() -> None:
    async with serve_split(two_mocks(), [split({"a": 1, "b": 0})]) as served:
        expected = (await served.client.generate(greedy("a", max_tokens=60, ignore_eos=True))).outputs[0].token_ids
        requests = [greedy("ab", max_tokens=60, ignore_eos=True) for _ in range(4)]
        running = [asyncio.ensure_future(served.client.generate(request)) for request in requests]
        await asyncio.sleep(0.05)  # 10 of each request's 60 steps
        assert all(not call.done() for call in running)
        served.running.gateway.reroute([split({"a": 0, "b": 1})], [])
        after = await served.engines_of([greedy("ab", max_tokens=1) for _ in range(20)])
        with pytest.raises(ConfigurationError, match="splits\\[0\\]"):
            served.running.gateway.reroute([split({"a": 1, "c": 1})], [])
        unchanged = await served.engines_of([greedy("ab", max_tokens=1) for _ in range(20)])
        finished = await asyncio.gather(*running)
    assert set(after) == set(unchanged) == {"b"}
    for completion in finished:
        output = completion.outputs[0]
        assert output.token_ids == expected and output.finish_reason == pb.FINISH_REASON_LENGTH
