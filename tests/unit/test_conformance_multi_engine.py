"""The conformance kit against an endpoint of two engines: every rule holds for each model, and no
rule leaves state behind, an adapter or a KV session (LoRA RPCs are endpoint-wide; ranks are the
endpoint's, not the engine's)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.client import OpenEngineClient
from openengine_gateway.conformance import (
    CheckFailed,
    Outcome,
    Rule,
    Target,
    all_rules,
    in_process_target,
    run_rule,
)
from openengine_gateway.testing import serve_backends

MODELS = ("plain", "lora")


def _mock(**settings: Any) -> MockBackend:
    return MockBackend(MockSettings(decode_time_per_step_s=0.002, **settings))


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[OpenEngineClient]:
    """One endpoint: ``plain`` without LoRA (one rank), then ``lora`` with LoRA (two ranks: endpoint ranks 1, 2)."""
    engines = [("plain", _mock(enable_lora=False)), ("lora", _mock(data_parallel_size=2))]
    async with serve_backends(engines) as running:
        connected = await OpenEngineClient.connect(running.address)
        async with connected:
            yield connected


def _rule(rule_id: str) -> Rule:
    return next(rule for rule in all_rules() if rule.id == rule_id)


async def _target(client: OpenEngineClient, model: str) -> Target:
    return await Target.open(client, model, timeout_s=30.0)


async def test_lora_disabled_does_not_apply_where_another_engine_serves_lora(client: OpenEngineClient) -> None:
    result = await run_rule(_rule("lora.disabled"), await _target(client, "plain"))
    assert result.outcome is Outcome.NOT_APPLICABLE, result.message
    assert "endpoint-wide" in result.message
    assert list(await client.list_loras()) == []


async def test_lora_generate_disabled_still_holds_per_model(client: OpenEngineClient) -> None:
    result = await run_rule(_rule("lora.generate-disabled"), await _target(client, "plain"))
    assert result.outcome is Outcome.PASSED, result.message


@pytest.mark.parametrize(("model", "ranks"), [("plain", (0,)), ("lora", (1, 2))])
async def test_a_models_ranks_are_its_block_of_the_endpoints(
    client: OpenEngineClient, model: str, ranks: tuple[int, ...]
) -> None:
    assert await (await _target(client, model)).data_parallel_ranks() == ranks


@pytest.mark.parametrize("rule_id", ["kv.sequence-numbers", "kv.replay"])
@pytest.mark.parametrize("model", MODELS)
async def test_kv_rules_watch_the_chosen_models_ranks(client: OpenEngineClient, model: str, rule_id: str) -> None:
    result = await run_rule(_rule(rule_id), await _target(client, model))
    assert result.outcome is Outcome.PASSED, result.message


@pytest.mark.parametrize("model", MODELS)
async def test_every_rule_holds_for_each_model_and_leaves_no_adapter(client: OpenEngineClient, model: str) -> None:
    target = await _target(client, model)
    failed = []
    for rule in all_rules():
        result = await run_rule(rule, target)
        if result.outcome is Outcome.FAILED:
            failed.append(f"{rule.id}: {result.message}")
        assert list(await client.list_loras()) == [], f"{rule.id} left an adapter loaded"
    assert failed == []


@pytest.mark.parametrize("ending", ["fails", "hangs"])
async def test_a_rule_that_fails_after_loading_an_adapter_leaves_none(client: OpenEngineClient, ending: str) -> None:
    async def check(target: Target) -> None:
        await target.load_lora(pb.LoraAdapter(lora_id=7, lora_name="left-behind", source_path=tempfile.gettempdir()))
        if ending == "hangs":
            await asyncio.Event().wait()
        raise CheckFailed("the check fails after its load")

    target = await Target.open(client, "lora", timeout_s=2.0)
    result = await run_rule(Rule("test.leaves-nothing", "tests", "a check", check), target)
    assert result.outcome is Outcome.FAILED
    assert list(await client.list_loras()) == []


async def test_no_rule_leaves_a_prefilled_kv_session_behind() -> None:
    """A prefill's session waits for a decode that never comes: the kit aborts it when the rule ends."""
    async with in_process_target(_mock(role="prefill"), timeout_s=30.0) as target:
        for rule in all_rules():
            await run_rule(rule, target)
            load = await target.client.load()
            assert load.active_kv_sessions == 0, f"{rule.id} left a KV session open"
