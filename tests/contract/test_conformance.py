"""Every conformance rule against every mock configuration: the gateway must never fail one.

Rules that a configuration does not advertise what they need for are skipped (not
applicable); a failure names the rule and quotes the spec sentence it checks.
"""

from __future__ import annotations

import pytest
from openengine_gateway.conformance import Rule, all_rules, assert_conforms, run_rule

from .conftest import CONFIGS, Targets, fresh_target

RULES = all_rules(include_disruptive=True)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
async def test_rule(targets: Targets, config: str, rule: Rule) -> None:
    if rule.disruptive:
        async with fresh_target(config) as target:
            result = await run_rule(rule, target)
    else:
        result = await run_rule(rule, await targets.get(config))
    assert_conforms(result)
