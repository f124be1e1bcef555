"""The gateway's conformance checks (the contract rules that apply to a real engine) on vLLM, in both
wire layouts: the seed's ``OpenEngine`` and upstream's later ``Inference``/``Control``.

Rules a vLLM engine does not advertise, or an RPC the layout lacks, report not-applicable and are
skipped; disruptive rules (a Drain that stops admission) are left out, since the session's one engine
serves every test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("vllm")
pytest.importorskip("openengine_gateway.conformance.checks")

from openengine_gateway.client import LAYOUTS
from openengine_gateway.conformance.kit import Rule, Target, all_rules, run_rule
from openengine_gateway.conformance.testing import assert_conforms, target_at
from openengine_gateway.testing import RunningGateway

from tests.engines.streams import MODEL

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", params=LAYOUTS)
async def target(gateway: RunningGateway, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """The session's vLLM engine as a conformance target, spoken to in one layout."""
    async with target_at(gateway.address, MODEL, layout=request.param) as target:
        yield target


@pytest.mark.parametrize(
    "rule",
    all_rules(),
    ids=lambda rule: rule.id,
)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
