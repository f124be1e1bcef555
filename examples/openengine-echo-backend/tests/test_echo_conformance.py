"""The OpenEngine conformance kit against the echo engine, in process over real gRPC.

This is how a plugin author proves a driver: every rule of the contract runs against it; a rule
for something the driver does not advertise reports not-applicable and is skipped. Each rule gets
a fresh engine and gateway, so no rule sees what another left behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openengine_echo import EchoBackend, EchoSettings
from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, in_process_target, run_rule


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    # a millisecond per token, like a real engine: rules that race a running request need it to run
    async with in_process_target(EchoBackend(EchoSettings(token_delay_s=0.001)), model="echo") as target:
        yield target


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
