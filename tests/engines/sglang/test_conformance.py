"""The gateway's conformance checks on real SGLang (disruptive rules left out)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, in_process_target, run_rule

from tests.engines.streams import MODEL

from .conftest import server_options

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
async def target(tiny_model: Path) -> AsyncIterator[Target]:
    """An SGLang engine with priority scheduling as a conformance target."""
    backend = SglangBackend(SglangSettings(model=str(tiny_model), **server_options(enable_priority_scheduling=True)))
    async with in_process_target(backend, model=MODEL, timeout_s=120.0) as opened:
        yield opened


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
