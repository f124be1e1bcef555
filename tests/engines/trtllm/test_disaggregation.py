"""A prefill and a decode TensorRT-LLM engine on one GPU, handing requests off through a KV session.

Each engine runs in a gateway process of its own (the real ``openengine-gateway`` command), as a
deployment runs them; the decode side receives the prefill's ``PrefillReady`` session unchanged,
and its tokens are checked against the session's aggregated engine run greedily on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("tensorrt_llm")

from openengine_gateway import pb

from tests.engines.streams import MODEL, generate_request
from tests.process import GatewayProcess, gateway_process
from tests.responses import collect, finished, tokens

from .conftest import llm_options, option_flags

pytestmark = pytest.mark.trtllm

PROMPT = "the quick brown fox jumps over"
TRANSCEIVER = {"cache_transceiver_config": {"backend": "DEFAULT"}}
GREEDY = pb.SamplingParams(temperature=0.0)
STARTUP_S = 600.0
"""TensorRT-LLM builds and warms an engine for minutes on a cold machine."""


@pytest.fixture(scope="module")
async def pair(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Any, Any]]:
    """Stubs of a prefill gateway and a decode gateway, each a process serving one engine as ``tiny``."""
    cwd = tmp_path_factory.mktemp("trtllm-pd")

    def args(role: str) -> tuple[str, ...]:
        flags = option_flags(llm_options(**TRANSCEIVER))
        return ("--backend", "trtllm", "--model", str(tiny_model), "--served-model-name", MODEL, "--role", role, *flags)

    async with (
        gateway_process(*args("prefill"), cwd=cwd, startup_s=STARTUP_S) as prefill,
        gateway_process(*args("decode"), cwd=cwd, startup_s=STARTUP_S) as decode,
        grpc.aio.insecure_channel(prefill.address) as prefill_channel,
        grpc.aio.insecure_channel(decode.address) as decode_channel,
    ):
        yield pb.OpenEngineStub(prefill_channel), pb.OpenEngineStub(decode_channel)
        await _stopped(prefill, decode)


async def _stopped(*processes: GatewayProcess) -> None:
    for process in processes:
        assert await process.stop(within_s=120.0) == 0


async def test_a_prefill_hands_its_kv_cache_to_decode(pair: tuple[Any, Any], llm: Any) -> None:
    prefill, decode = pair
    stopping = pb.StoppingOptions(max_tokens=12, ignore_eos=True)
    info = await prefill.GetEngineInfo(pb.GetEngineInfoRequest())
    assert info.role == pb.ENGINE_ROLE_PREFILL and not info.kv_connector.supports_abort_cleanup
    ready = await collect(prefill, generate_request("ctx", prompt=PROMPT, sampling=GREEDY, stopping=stopping))
    assert ready[-1].HasField("prefill_ready"), "the prefill stream ends at PrefillReady"
    # The decode side comes late: a prefill whose result was not final at its handoff must not have been
    # aborted when its stream ended (the KV transfer would be cancelled).
    await asyncio.sleep(2.0)
    resumed = generate_request("gen", prompt=PROMPT, sampling=GREEDY, stopping=stopping)
    resumed.kv.session.CopyFrom(ready[-1].prefill_ready.kv_session)
    decoded = await collect(decode, resumed)
    assert finished(decoded)[0].reason == pb.FINISH_REASON_LENGTH
    from tensorrt_llm import SamplingParams

    own = await llm.generate_async(
        {"prompt_token_ids": llm.tokenizer.encode(PROMPT)},
        sampling_params=SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    )
    assert [t.token_id for t in tokens(decoded)] == own.outputs[0].token_ids


async def test_abort_of_a_handed_off_session_has_nothing_to_release(pair: tuple[Any, Any]) -> None:
    prefill, _ = pair
    request = generate_request("ctx-abort", prompt=PROMPT, stopping=pb.StoppingOptions(max_tokens=4))
    session = (await collect(prefill, request))[-1].prefill_ready.kv_session
    aborted = await prefill.Abort(pb.AbortRequest(kv_session=session))
    assert aborted.status == pb.ABORT_STATUS_ALREADY_FINISHED
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await prefill.Abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="123456789")))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
