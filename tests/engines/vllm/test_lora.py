"""LoRA adapters on real vLLM: a second engine, started with ``--enable-lora``, for this module only.

The session's engine runs without LoRA: on vLLM's CPU build a LoRA-enabled engine cannot score
prompt positions in a batch (its CPU kernels map only sampled rows), so it advertises no prompt
logprobs, and the session's engine keeps them for the tests that compare them with transformers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")
pytest.importorskip("openengine_gateway.conformance.checks")

from openengine_gateway import pb
from openengine_gateway.conformance.kit import Rule, Target, all_rules, run_rule
from openengine_gateway.conformance.testing import assert_conforms, target_at
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect, tokens

from .conftest import engine_options
from .reference import TOLERANCE, Reference, write_lora

pytestmark = pytest.mark.vllm

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
async def lora_gateway(tiny_model: Path) -> AsyncIterator[RunningGateway]:
    """The tiny Llama on an engine with LoRA enabled (rank 8, two adapters at a time)."""
    from openengine_backends.vllm import VllmBackend, VllmSettings

    options = engine_options(enable_lora=True, max_lora_rank=8, max_loras=2, kv_events_config=None)
    async with serve_backends([(MODEL, VllmBackend(VllmSettings(model=str(tiny_model), **options)))]) as running:
        yield running


@pytest.fixture
def stub(lora_gateway: RunningGateway) -> pb.OpenEngineStub:
    """A client of the LoRA engine's gateway."""
    return lora_gateway.stub


@pytest.fixture(scope="module")
async def target(lora_gateway: RunningGateway) -> AsyncIterator[Target]:
    """The LoRA engine as a conformance target."""
    async with target_at(lora_gateway.address, MODEL) as target:
        yield target


async def test_lora_load_generate_list_unload(
    stub: pb.OpenEngineStub, tiny_model: Path, reference: Reference, tmp_path: Path
) -> None:
    adapter = write_lora(tiny_model, tmp_path / "adapter")
    lora = pb.LoraAdapter(lora_id=3, lora_name="sharp", source_path=str(adapter))
    loaded = await stub.LoadLora(pb.LoadLoraRequest(adapter=lora))
    assert not loaded.already_loaded
    assert (await stub.LoadLora(pb.LoadLoraRequest(adapter=lora))).already_loaded
    assert [a.lora_name for a in (await stub.ListLoras(pb.ListLorasRequest())).adapters] == ["sharp"]
    prompt_ids = reference.encode(PROMPT)
    request = generate_request(
        "lora",
        prompt=prompt_ids,
        lora_name="sharp",
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingOptions(max_tokens=12, ignore_eos=True),
        response=pb.ResponseOptions(return_output_logprobs=True),
    )
    got = tokens(await collect(stub, request))
    merged = Reference(tiny_model, lora=adapter).greedy(prompt_ids, 12)
    assert [t.token_id for t in got] == [step.token_id for step in merged]
    assert [step.token_id for step in merged] != [step.token_id for step in reference.greedy(prompt_ids, 12)]
    for token, step in zip(got, merged, strict=True):
        assert token.logprob == pytest.approx(step.logprob, abs=TOLERANCE)
    await stub.UnloadLora(pb.UnloadLoraRequest(lora_name="sharp"))
    assert not (await stub.ListLoras(pb.ListLorasRequest())).adapters
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(stub, request)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_prompt_logprobs_are_not_advertised_and_are_refused(stub: pb.OpenEngineStub) -> None:
    """What would kill a CPU engine with LoRA (prompt logprobs in a batch) never reaches it."""
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
    assert info.supports_lora and not info.generation.prompt_logprobs.supported
    assert info.generation.output_logprobs.supported
    asking = [
        generate_request(
            f"prompt-logprobs-{n}",
            prompt=PROMPT,
            sampling=pb.SamplingParams(temperature=1.0, num_sequences=3),
            stopping=pb.StoppingOptions(max_tokens=4),
            response=pb.ResponseOptions(return_prompt_logprobs=True),
        )
        for n in range(3)
    ]
    results = await asyncio.gather(*(collect(stub, request) for request in asking), return_exceptions=True)
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results)
    assert {r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)} == {grpc.StatusCode.INVALID_ARGUMENT}
    batch = [
        generate_request(f"batch-{n}", prompt=PROMPT, stopping=pb.StoppingOptions(max_tokens=4), response=response)
        for n, response in enumerate([pb.ResponseOptions(return_output_logprobs=True), pb.ResponseOptions()] * 2)
    ]
    streams = await asyncio.gather(*(collect(stub, request) for request in batch))
    assert all(s[-1].finished.reason == pb.FINISH_REASON_LENGTH for s in streams)
    health = await stub.Health(pb.HealthRequest())
    assert health.state == pb.HEALTH_STATE_READY


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.id.startswith("lora.")], ids=lambda rule: rule.id)
async def test_lora_rule(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))
