"""LoRA adapters and prefill/decode disaggregation on real SGLang (one engine pair per test)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

pytest.importorskip("sglang")

from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_gateway import pb
from openengine_gateway.testing import serve_backends

from tests.engines.streams import MODEL, free_port, generate_request
from tests.process import gateway_process
from tests.responses import collect, finished, tokens

from .conftest import engine_of, option_flags, server_options, start

pytestmark = pytest.mark.sglang

PROMPT = "the quick brown fox jumps over"


async def test_lora_load_generate_unload(tiny_model: Path, tmp_path: Path) -> None:
    from ..vllm.reference import write_lora

    adapter = write_lora(tiny_model, tmp_path / "adapter")
    lora = {"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ["all"], "max_loras_per_batch": 2}
    sampling = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    async with start(tiny_model, **lora) as running:
        spec = pb.LoraAdapter(lora_id=3, lora_name="sharp", source_path=str(adapter))
        await running.stub.LoadLora(pb.LoadLoraRequest(adapter=spec))
        request = generate_request(
            "lora",
            prompt=PROMPT,
            lora_name="sharp",
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingOptions(max_tokens=12, ignore_eos=True),
        )
        got = [t.token_id for t in tokens(await collect(running.stub, request))]
        reference = await engine_of(running).async_generate(prompt=PROMPT, sampling_params=sampling, lora_path="sharp")
        assert got == reference["output_ids"]
        await running.stub.UnloadLora(pb.UnloadLoraRequest(lora_name="sharp"))
        assert not (await running.stub.ListLoras(pb.ListLorasRequest())).adapters


async def test_prefill_ready_then_decode_with_sglangs_fake_transfer(tiny_model: Path, tmp_path: Path) -> None:
    """SGLang's ``fake`` transfer backend moves no KV, but the bootstrap handshake runs as with a real one.

    Each SGLang engine needs a gateway of its own: the prefill runs in this process, the decode in the
    real ``openengine-gateway`` command."""
    shared = {"disaggregation_transfer_backend": "fake", "mem_fraction_static": 0.1}
    prefill_options = server_options(disaggregation_mode="prefill", disaggregation_bootstrap_port=free_port(), **shared)
    prefill = SglangBackend(SglangSettings(model=str(tiny_model), **prefill_options))
    decode_flags = option_flags(server_options(disaggregation_mode="decode", **shared))
    decode_args = ("--backend", "sglang", "--model", str(tiny_model), "--served-model-name", MODEL, *decode_flags)
    async with (
        serve_backends([(MODEL, prefill)]) as running,
        gateway_process(*decode_args, cwd=tmp_path, startup_s=300.0) as decoding,
    ):
        (ready,) = await collect(running.stub, generate_request("pd", prompt=PROMPT))
        assert ready.HasField("prefill_ready")
        session = ready.prefill_ready.kv_session
        assert {"bootstrap_host", "bootstrap_port", "bootstrap_room"} <= set(session.attributes_struct.keys())
        request = generate_request("pd", prompt=PROMPT, kv=pb.KvOptions(session=session))
        request.stopping.max_tokens = 8
        async with grpc.aio.insecure_channel(decoding.address) as channel:
            responses = await collect(pb.OpenEngineStub(channel), request)
        assert 0 in finished(responses)
        assert await decoding.stop() == 0
