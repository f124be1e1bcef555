"""Two mock engines from one ``plugins.toml``, behind one endpoint: routing and aggregation over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openengine_gateway import pb
from openengine_gateway.client import OpenEngineClient, StatusError, text_request
from openengine_gateway.config import load_config
from openengine_gateway.core.gateway import Gateway
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.launch import plan_engines, start_engines
from openengine_gateway.server.app import GatewayServer, ServerOptions

from tests.fakes import eventually

CONFIG = """
[plugins]
allow = ["mock"]

[backends.mock]                  # every mock engine: fast and without a transfer server
prefill_time_per_token_s = 0.0

[[engines]]
backend = "mock"
served_model_name = "small"
aliases = ["a"]
options = { model = "small-model", seed = 1, data_parallel_size = 2 }

[[engines]]
backend = "mock"
served_model_name = "large"
aliases = ["b"]
options = { model = "large-model", seed = 2, max_context_length = 4096, enable_lora = false }
"""


@contextlib.asynccontextmanager
async def serving(config_text: str, tmp_path: Path) -> AsyncIterator[tuple[OpenEngineClient, Gateway]]:
    path = tmp_path / "plugins.toml"
    path.write_text(config_text)
    config = load_config(path)
    engines = await start_engines(config.engines, config)
    server = GatewayServer(Gateway(engines), ServerOptions(port=0))
    await server.start()
    try:
        async with await OpenEngineClient.connect(server.address) as client:
            yield client, server.gateway
    finally:
        await server.stop(0)


async def test_two_engines_route_by_name_and_aggregate(tmp_path: Path) -> None:
    async with serving(CONFIG, tmp_path) as (client, gateway):
        info = client.engine_info
        assert info is not None and list(info.supported_models) == ["small", "a", "large", "b"]
        assert info.engine_name == "mock"  # both are mock engines of the same version
        assert info.parallelism.data_parallel_size == 3  # 2 ranks of "small", 1 of "large"
        assert (await client.model_info("b")).max_context_length == 4096
        assert (await client.model_info("a")).served_model_name == "small"

        # routing: the same request on two names reaches two differently seeded engines
        small = await client.generate(text_request("Hello", model="a", max_tokens=8, seed=3))
        large = await client.generate(text_request("Hello", model="large", max_tokens=8, seed=3))
        assert small.outputs[0].token_ids != large.outputs[0].token_ids

        # KV events: each engine on its own endpoint ranks (prompts long enough to fill a KV block)
        prompt = "A prompt that is long enough to fill one KV block of sixteen tokens"
        await client.generate(text_request(prompt, model="small", max_tokens=2, data_parallel_rank=1))
        await client.generate(text_request(prompt, model="b", max_tokens=2))
        snapshot = client.kv_events(pb.SubscribeKvEventsRequest(include_snapshot=True))
        stored = {}
        for _ in range(3):
            batch = (await asyncio.wait_for(anext(snapshot), 2)).batch
            stored[batch.data_parallel_rank] = len(batch.events)
        assert stored[1] > 0 and stored[2] > 0  # "small"'s second replica, then "large"'s only one
        await snapshot.aclose()
        with pytest.raises(StatusError, match="not one of this model's ranks"):
            await client.generate(text_request("x", model="large", max_tokens=1, data_parallel_rank=0))

        # load: summed, per rank on endpoint ranks, each engine's ranks named
        load = await client.load(per_rank=True)
        assert [r.data_parallel_rank for r in load.ranks] == [0, 1, 2]
        assert (load.attributes["small.ranks"], load.attributes["large.ranks"]) == ("0,1", "2")
        assert load.total_kv_blocks == 3 * 1024

        # health: every engine's checks, each named by its model
        health = await client.health()
        assert health.state == pb.HEALTH_STATE_READY
        assert {c.message.split(":")[0] for c in health.checks if c.name == "model"} == {"small", "large"}

        # runtime events say which engine they came from
        runtime = client.runtime_events(pb.SubscribeRuntimeEventsRequest(types=[pb.RUNTIME_EVENT_TYPE_FORWARD_PASS]))
        pending = asyncio.ensure_future(anext(runtime))
        await eventually(lambda: gateway.events.runtime.subscriber_count == 1)
        await client.generate(text_request("Which engine?", model="large", max_tokens=2))
        assert (await asyncio.wait_for(pending, 2)).runtime_event.attributes["model"] == "large"


def test_a_name_served_twice_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "plugins.toml"
    path.write_text(CONFIG.replace('aliases = ["b"]', 'aliases = ["a"]'))
    config = load_config(path)
    with pytest.raises(ConfigurationError, match="'a' is served twice"):
        plan_engines(config.engines, config)
