"""Every conformance rule against every mock configuration, asked in both layouts: the gateway must never
fail one, and both layouts give each rule the same outcome unless the later layout lacks what it needs.

Rules that a configuration does not advertise what they need for are skipped (not
applicable); a failure names the rule and quotes the spec sentence it checks.
"""

from __future__ import annotations

import pytest
from openengine_gateway.client import LAYOUTS, Layout
from openengine_gateway.conformance import Outcome, Rule, all_rules, assert_conforms, run_rule

from .conftest import CONFIGS, Targets, fresh_target

RULES = all_rules(include_disruptive=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
async def test_rule(targets: Targets, config: str, rule: Rule, layout: Layout) -> None:
    if rule.disruptive:
        async with fresh_target(config, layout=layout) as target:
            result = await run_rule(rule, target)
    else:
        result = await run_rule(rule, await targets.get(config, layout))
    targets.outcomes[config, layout, rule.id] = result.outcome
    assert_conforms(result)


LATER_LACKS = {
    rule.id for rule in RULES if rule.id.split(".")[0] in {"classify", "embed", "score", "tasks", "drain"}
} | {"runtime-events.type-filter"}
"""Rules of the RPCs the later layout does not have (Embed, Classify, Score, Drain, SubscribeRuntimeEvents; its
ModelInfo advertises no tasks): not applicable there. Every other rule has the same outcome in both layouts."""


async def test_both_layouts_give_every_other_rule_the_same_outcome(targets: Targets) -> None:
    """Every rule run above in both layouts (all of them, unless selected with ``-k``) has the same outcome in
    each, except ``LATER_LACKS``, which do not apply in the later layout."""
    pairs = {(config, rule) for config, _, rule in targets.outcomes}
    both = [
        (c, r) for c, r in sorted(pairs) if (c, "seed", r) in targets.outcomes and (c, "later", r) in targets.outcomes
    ]
    if not both:
        pytest.skip("no rule ran in both layouts")
    seed = {(c, r): targets.outcomes[c, "seed", r] for c, r in both}
    later = {(c, r): targets.outcomes[c, "later", r] for c, r in both}
    lacking = {(c, r) for (c, r), outcome in later.items() if r in LATER_LACKS}
    assert {key: later[key] for key in lacking} == dict.fromkeys(lacking, Outcome.NOT_APPLICABLE)
    differ = {
        key: (seed[key].value, later[key].value) for key in seed if key not in lacking and seed[key] != later[key]
    }
    assert differ == {}
