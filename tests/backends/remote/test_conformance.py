"""The conformance kit through a front gateway: ``remote`` in front of a gateway serving ``mock``.

What the front serves must conform exactly as the engine behind it does; rules the mock does not
advertise report not-applicable and are skipped. One back gateway serves every rule; each rule
gets a fresh front, so no rule sees requests another left behind there. The front asks the back in
either layout: through the later one, what that layout lacks (tasks, runtime events) is not applicable.
Disruptive rules (a Drain that stops admission) are left out: the back serves them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openengine_gateway.client import LAYOUTS
from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, in_process_target, run_rule
from openengine_gateway.testing import RunningGateway

from .support import back, remote


@pytest.fixture(scope="module")
async def behind() -> AsyncIterator[RunningGateway]:
    """The back gateway, serving a mock engine as ``mock`` at a realistic pace (rules that race a
    request, such as a Drain while one is in flight, need it to still be running)."""
    async with back(decode_time_per_step_s=0.002) as (running, _):
        yield running


@pytest.fixture(params=LAYOUTS)
async def target(behind: RunningGateway, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A front gateway's only model, ``model``, as a conformance target; the front asks the back in the seed
    layout or the later one (which has no runtime events to relay)."""
    layout = request.param
    events = "on" if layout == "seed" else "auto"
    async with in_process_target(remote(behind.address, layout=layout, runtime_events=events)) as target:
        yield target


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
