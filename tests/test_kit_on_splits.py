"""The whole conformance kit against a split's name, served by the real command: 0 failures, for a
split of two mocks (one tokenizer) and for a split of the mock and the third-party example plugin
(tokenizers that differ, so token ids are withdrawn and refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway import pb
from openengine_gateway.client import Layout, OpenEngineClient
from openengine_gateway.conformance import Outcome, Target, all_rules, run_rules
from openengine_gateway.plugins import installed_backends

from tests.process import gateway_process

MOCK = 'backend = "mock"\noptions = {{ decode_time_per_step_s = 0.002 }}\nserved_model_name = "{name}"\n'
ECHO = 'backend = "echo"\nserved_model_name = "echo"\n'


async def kit_on_split(
    tmp_path: Path, engines: dict[str, str], layout: Layout = "seed"
) -> tuple[dict[str, list[str]], pb.ModelInfo]:
    """Serve ``engines`` (served name -> its [[engines]] table) and a split ``ab`` of them, half and
    half, and run every rule against ``ab``: rule ids by outcome (a failure with its message), and
    what the split advertised."""
    tables = "".join(f"[[engines]]\n{table}\n" for table in engines.values())
    weights = ", ".join(f'"{name}" = 50' for name in engines)
    config = tmp_path / "plugins.toml"
    config.write_text(
        f'[plugins]\nallow = ["mock", "echo"]\n\n{tables}[[splits]]\nname = "ab"\nengines = {{ {weights} }}\n'
    )
    async with gateway_process("--config", str(config), cwd=tmp_path) as gateway:
        async with await OpenEngineClient.connect(gateway.address, layout=layout) as client:
            target = await Target.open(client, "ab", timeout_s=60.0)
            assert target.sticky == ("metadata.session", "cache_salt"), "the kit reads the split's sticky sources"
            results = await run_rules(target, all_rules())
        assert await gateway.stop() == 0
    outcomes: dict[str, list[str]] = {outcome.value: [] for outcome in Outcome}
    for result in results:
        entry = result.rule.id + (f": {result.message}" if result.outcome is Outcome.FAILED else "")
        outcomes[result.outcome.value].append(entry)
    return outcomes, target.model_info


@pytest.mark.parametrize("layout", ["seed", "later"])
async def test_the_kit_passes_on_a_split_of_two_mocks(tmp_path: Path, layout: Layout) -> None:
    outcomes, _ = await kit_on_split(tmp_path, {name: MOCK.format(name=name) for name in ("m1", "m2")}, layout)
    assert outcomes["failed"] == []
    passed = set(outcomes["passed"])
    assert {"health.inference-probe", "stopping.stop-token", "generate.deltas", "stopping.include-stop-text"} <= passed


@pytest.mark.skipif(
    "echo" not in {b.name for b in installed_backends()},
    reason="the example plugin is not installed (pip install ./examples/openengine-echo-backend)",
)
async def test_the_kit_passes_on_a_split_whose_tokenizers_differ(tmp_path: Path) -> None:
    outcomes, model_info = await kit_on_split(tmp_path, {"m1": MOCK.format(name="m1"), "echo": ECHO})
    assert outcomes["failed"] == []
    assert model_info.HasField("supports_token_ids_input") and not model_info.supports_token_ids_input
    assert "stopping.stop-token" in outcomes["not_applicable"], "token-id input is denied on this split"
    assert {"health.inference-probe", "generate.deltas", "stopping.stop-text"} <= set(outcomes["passed"])
