"""The conformance kit against the driver on the fake TensorRT-LLM, over real gRPC.

Three engines: aggregated (LoRA, KV events, statistics, no grammar backend: the fake cannot
honour JSON or EBNF guides, so guidance is advertised unsupported and must be refused),
prefill and decode (a cache transceiver). The model's generation config sets top_k 20, as Qwen3's
does: the kit asks output logprobs of a request that sets no knob, which TensorRT-LLM's top-k
logprob rows serve only under top-k sampling (``mapping``; the refusal without one is tested in
``test_engine``). Rules an engine does not advertise report
not-applicable and are skipped; disruptive rules (a Drain that stops admission) are left out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_gateway.conformance import Rule, Target, all_rules, assert_conforms, in_process_target, run_rule

from . import fake_llm
from .conftest import trtllm
from .fake_api import install

STEP_S = 0.001
"""A step of the fake engine: a long request stays in flight for a second or more, however loaded the machine,
while a rule opens a second call against it (a duplicate id, an abort, a drain)."""
TRANSCEIVER = {"cache_transceiver_config": {"backend": "UCX"}}
CONFIGS: dict[str, dict[str, Any]] = {
    "aggregated": {"enable_lora": True, "kv_cache_config": {"tokens_per_block": 4, "event_buffer_max_size": 64}},
    "prefill": {"role": "prefill", **TRANSCEIVER},
    "decode": {"role": "decode", **TRANSCEIVER},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
async def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Target]:
    """One configuration's engine as a conformance target."""
    model = tmp_path_factory.mktemp("model")
    (model / "generation_config.json").write_text('{"top_k": 20}')
    with pytest.MonkeyPatch.context() as patch:
        install(patch)
        patch.setattr(fake_llm, "STEP_S", STEP_S)
        async with in_process_target(trtllm(str(model), **CONFIGS[request.param]), timeout_s=30.0) as opened:
            yield opened


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
