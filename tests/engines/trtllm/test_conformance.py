"""The gateway's conformance checks on real TensorRT-LLM.

Rules the engine does not advertise report not-applicable and are skipped; disruptive rules
(a Drain that stops admission) are left out, since the session's one engine serves every test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("tensorrt_llm")

from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, run_rule, target_at
from openengine_gateway.testing import RunningGateway

from tests.engines.streams import MODEL

pytestmark = pytest.mark.trtllm


@pytest.fixture(scope="module")
async def target(gateway: RunningGateway) -> AsyncIterator[Target]:
    """The session's TensorRT-LLM engine as a conformance target."""
    async with target_at(gateway.address, MODEL) as target:
        yield target


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
