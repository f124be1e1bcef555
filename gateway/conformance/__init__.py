"""The OpenEngine conformance kit: the contract's rules as checks against any endpoint.

From the command line: ``openengine-gateway conformance --target host:port``. From pytest, a
driver author runs the same checks against their driver in process::

    from openengine_gateway.conformance import all_rules, in_process_target, run_rule

    @pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
    async def test_conformance(rule):
        async with in_process_target(MyBackend(MyBackend.Settings())) as target:
            assert_conforms(await run_rule(rule, target))
"""

from .kit import (
    RULES,
    CheckFailed,
    NotApplicable,
    OpenCall,
    Outcome,
    Result,
    Rule,
    Stream,
    Target,
    all_rules,
    rule,
    run_rule,
    run_rules,
)
from .testing import assert_conforms, in_process_target, target_at

__all__ = [
    "RULES",
    "CheckFailed",
    "NotApplicable",
    "OpenCall",
    "Outcome",
    "Result",
    "Rule",
    "Stream",
    "Target",
    "all_rules",
    "assert_conforms",
    "in_process_target",
    "rule",
    "run_rule",
    "run_rules",
    "target_at",
]
