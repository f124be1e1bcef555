"""The per-engine request families over real gRPC and HTTP: each request of a split counted under the
engine that answered it and the split's name, each engine read from the gateway's own /metrics page."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.client import EngineErrorEvent, OpenEngineClient, StatusError, text_request
from openengine_gateway.config import SplitSection
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.testing import serve_backends

from tests.ops.support import mock
from tests.ops.test_metrics import Scrape, metrics_port, scrape_until

E = "openengine_gateway_engine"
REQUESTS = 60


def request(model: str) -> pb.GenerateRequest:
    return text_request("count me", model=model, request_id=uuid.uuid4().hex, max_tokens=4, ignore_eos=True)


async def test_each_engine_of_a_split_has_its_own_requests_latencies_and_tokens() -> None:
    """Engine ``b`` fails every request (``fault_rate`` 1), so the client knows which engine answered each."""
    backends = [("a", mock(seed=1)), ("b", mock(seed=2, fault_rate=1.0)), ("c", mock(total_kv_blocks=128))]
    split = SplitSection(name="ab", engines={"a": 1, "b": 1})
    async with (
        serve_backends(backends, splits=[split], server_options=ServerOptions(metrics_port=0)) as running,
        await OpenEngineClient.connect(running.address) as client,
    ):
        answered: Counter[str] = Counter()
        usage = Counter[str]()

        async def one(model: str) -> None:
            try:
                completion = await client.generate(request(model))
            except EngineErrorEvent as error:
                assert error.code == pb.ERROR_CODE_INTERNAL
                answered["b"] += 1
                return
            answered["a" if model == "ab" else "a direct"] += 1
            usage["prompt"] += completion.usage.prompt_tokens
            usage["completion"] += completion.usage.completion_tokens

        await asyncio.gather(*(one("ab") for _ in range(REQUESTS)), one("a"))
        with pytest.raises(StatusError) as refused:  # by c's driver: two outputs need more KV blocks than it has
            big = text_request("x" * 1000, model="c", request_id=uuid.uuid4().hex, max_tokens=1000, num_sequences=2)
            await client.generate(big)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT

        def settled(page: Scrape) -> bool:
            counts = (page.get(f"{E}_e2e_latency_seconds_count", engine=e, split="ab") for e in "ab")
            return sum(count or 0 for count in counts) == REQUESTS

        page = await scrape_until(metrics_port(running), settled)

    assert answered["a"] and answered["b"] and answered["a"] + answered["b"] == REQUESTS
    ab = {"split": "ab", "kind": "generate"}
    assert page(f"{E}_requests_total", engine="a", outcome="finished", code="OK", **ab) == answered["a"]
    assert page(f"{E}_requests_total", engine="b", outcome="failed", code="INTERNAL", **ab) == answered["b"]
    assert page.get(f"{E}_requests_total", engine="a", outcome="failed", code="INTERNAL", **ab) is None
    assert page(f"{E}_requests_total", engine="a", split="", kind="generate", outcome="finished", code="OK") == 1
    a = {"engine": "a", "split": "ab"}
    assert page(f"{E}_time_to_first_token_seconds_count", **a) == answered["a"]
    assert 0 < page(f"{E}_inter_token_latency_seconds_count", **a) <= 3 * answered["a"]  # 4 tokens, per message
    assert page(f"{E}_time_to_first_token_seconds_count", engine="b", split="ab") == 0  # no token before failing
    for engine, count in answered.items():
        labels = {"engine": engine.split()[0], "split": "" if " " in engine else "ab"}
        assert page(f"{E}_e2e_latency_seconds_count", **labels) == count
        assert page(f"{E}_queue_time_seconds_count", **labels) == count
    assert page(f"{E}_e2e_latency_seconds_sum", **a) > 0
    assert (
        page(f"{E}_prompt_tokens_total", **a) + page(f"{E}_prompt_tokens_total", engine="a", split="")
        == usage["prompt"]
    )
    assert page(f"{E}_completion_tokens_total", **a) == 4 * answered["a"]
    c = {"engine": "c", "split": "", "kind": "generate"}
    assert page(f"{E}_requests_total", outcome="rejected", code="INVALID_ARGUMENT", **c) == 1
    # the gateway-wide families are the sums over engines
    assert page("openengine_gateway_request_outcomes_total", kind="generate", outcome="failed") == answered["b"]
    assert page("openengine_gateway_completion_tokens_total") == usage["completion"]
    assert page("openengine_gateway_time_to_first_token_seconds_count") == answered["a"] + 1
