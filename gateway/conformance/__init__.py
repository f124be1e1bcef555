"""The OpenEngine conformance kit: the contract's rules as checks against any endpoint.

From the command line: ``openengine-gateway conformance --target host:port``. From pytest (with
pytest-asyncio in ``asyncio_mode = "auto"``), a driver author runs the same checks against their
driver in process; ``tests/unit/test_conformance_example.py`` runs this very example::

    import pytest
    from openengine_gateway.conformance import all_rules, assert_conforms, in_process_target, run_rule

    from my_engine import MyBackend  # your driver


    @pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
    async def test_conformance(rule):
        settings = MyBackend.Settings(model="my-model")  # and every field your settings model requires
        async with in_process_target(MyBackend(settings)) as target:
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
