"""What the driver advertises against what real TensorRT-LLM accepts, and what it refuses at start.

The session's engine runs ``max_num_tokens`` 256 under ``max_seq_len`` 512 without chunked prefill,
so its context is bounded by the prompt check of ``LLM._check_arguments``; the LoRA checks start
engines of their own (each a gateway process, as deployed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("tensorrt_llm")

from openengine_gateway import pb

from tests.engines.streams import MODEL, generate_request
from tests.process import command, gateway_process
from tests.responses import collect, tokens

from .conftest import llm_options, option_flags

pytestmark = pytest.mark.trtllm

GREEDY = pb.SamplingParams(temperature=0.0)
ONE = pb.StoppingOptions(max_tokens=1, ignore_eos=True)
DOCS_LORA_CONFIG = {"max_loras": 4, "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense"]}
"""docs/backends/trtllm.md's ``--lora-config`` example."""
STARTUP_S = 600.0


def prompt(count: int) -> list[int]:
    return [5 + n % 400 for n in range(count)]


async def test_the_advertised_context_is_what_tensorrt_llm_accepts(stub: pb.OpenEngineStub, llm: Any) -> None:
    from tensorrt_llm import SamplingParams

    limit = (await stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))).max_context_length
    assert limit == 257, "max_num_tokens 256 + 1: a prompt of 256 tokens and one output token"
    longest = await collect(stub, generate_request("longest", prompt=prompt(limit - 1), sampling=GREEDY, stopping=ONE))
    assert len(tokens(longest)) == 1
    with pytest.raises(grpc.aio.AioRpcError) as over:
        await collect(stub, generate_request("over", prompt=prompt(limit), sampling=GREEDY, stopping=ONE))
    assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises((ValueError, RuntimeError), match="max_num_tokens"):  # TensorRT-LLM's own refusal
        await llm.generate_async({"prompt_token_ids": prompt(limit)}, sampling_params=SamplingParams(max_tokens=1))


async def test_the_engine_is_a_release_the_driver_serves(stub: pb.OpenEngineStub) -> None:
    from openengine_backends.trtllm.versions import check_version

    info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
    check_version(info.engine_version)


async def test_the_documented_lora_example_starts_and_one_without_target_modules_is_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    bare = await asyncio.create_subprocess_exec(
        *command(),
        *("--backend", "trtllm", "--model", str(tiny_model), "--lora-config", '{"max_loras": 4}'),
        *("--host", "127.0.0.1", "--port", "0"),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(bare.communicate(), STARTUP_S)
    assert bare.returncode == 2 and b"lora_target_modules" in stderr, stderr.decode(errors="replace")[-2000:]
    flags = option_flags(llm_options(lora_config=DOCS_LORA_CONFIG))
    args = ("--backend", "trtllm", "--model", str(tiny_model), "--served-model-name", MODEL, *flags)
    async with gateway_process(*args, cwd=tmp_path, startup_s=STARTUP_S) as started:
        async with grpc.aio.insecure_channel(started.address) as channel:
            info = await pb.OpenEngineStub(channel).GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        assert info.supports_lora
        assert await started.stop(within_s=120.0) == 0
