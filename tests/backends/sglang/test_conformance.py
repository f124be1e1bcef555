"""The conformance kit against the driver on the fake SGLang, over real gRPC.

Configurations: aggregated (LoRA, priority scheduling, deterministic seeds, KV events; no grammar
backend, since the fake cannot constrain generation: guides are advertised unsupported and must be
refused), a prefill and a decode engine. An embedding model is not a target: the kit expects every
aggregated engine to generate (``test_tasks`` covers it). Rules an engine does not advertise report
not-applicable and are skipped; disruptive rules (a Drain that stops admission) are left out.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, in_process_target, run_rule

from .conftest import sglang
from .fake_api import install


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


CONFIGS: dict[str, dict[str, Any]] = {
    "aggregated": {
        "enable_lora": True,
        "enable_priority_scheduling": True,
        "enable_deterministic_inference": True,
        "page_size": 4,
        "grammar_backend": "none",
    },
    "prefill": {"disaggregation_mode": "prefill"},
    "decode": {"disaggregation_mode": "decode"},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """One configuration's engine as a conformance target."""
    options = dict(CONFIGS[request.param])
    if request.param == "aggregated":
        options["kv_events_config"] = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{_port()}"})
    with pytest.MonkeyPatch.context() as patch:
        install(patch)
        async with in_process_target(sglang(**options), timeout_s=30.0) as opened:
            yield opened


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
