"""A prefill and a decode TensorRT-LLM engine on one GPU, handing requests off through a KV session.

Each engine is served by its own gateway, as two processes would serve them; the decode side
receives the prefill's ``PrefillReady`` session unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("tensorrt_llm")

from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect, finished, tokens

from .conftest import llm_options

pytestmark = pytest.mark.trtllm

PROMPT = "the quick brown fox jumps over"
TRANSCEIVER = {"cache_transceiver_config": {"backend": "DEFAULT"}}
Pair = tuple[RunningGateway, RunningGateway]


@pytest.fixture(scope="module")
async def pair(tiny_model: Path) -> AsyncIterator[Pair]:
    """A prefill gateway and a decode gateway, each serving one engine of the tiny model as ``tiny``."""
    from openengine_backends.trtllm import TrtllmBackend, TrtllmSettings

    def engine(role: str) -> Any:
        return TrtllmBackend(TrtllmSettings(model=str(tiny_model), role=role, **llm_options(**TRANSCEIVER)))

    async with (
        serve_backends([(MODEL, engine("prefill"))]) as prefill,
        serve_backends([(MODEL, engine("decode"))]) as decode,
    ):
        yield prefill, decode


async def test_a_prefill_hands_its_kv_cache_to_decode(pair: Pair, llm: Any) -> None:
    prefill, decode = pair
    greedy = pb.SamplingParams(temperature=0.0)
    stopping = pb.StoppingOptions(max_tokens=12, ignore_eos=True)
    ready = await collect(prefill.stub, generate_request("ctx", prompt=PROMPT, sampling=greedy, stopping=stopping))
    assert ready[-1].HasField("prefill_ready"), "the prefill stream ends at PrefillReady"
    session = ready[-1].prefill_ready.kv_session
    info = await prefill.stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert info.role == pb.ENGINE_ROLE_PREFILL and not info.kv_connector.supports_abort_cleanup
    resumed = generate_request("gen", prompt=PROMPT, sampling=greedy, stopping=stopping)
    resumed.kv.session.CopyFrom(session)
    decoded = await collect(decode.stub, resumed)
    assert finished(decoded)[0].reason == pb.FINISH_REASON_LENGTH
    from tensorrt_llm import SamplingParams

    own = await llm.generate_async(
        {"prompt_token_ids": llm.tokenizer.encode(PROMPT)},
        sampling_params=SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    )
    assert [t.token_id for t in tokens(decoded)] == own.outputs[0].token_ids


async def test_abort_of_a_handed_off_session_has_nothing_to_release(pair: Pair) -> None:
    prefill, _ = pair
    request = generate_request("ctx-abort", prompt=PROMPT, stopping=pb.StoppingOptions(max_tokens=4))
    session = (await collect(prefill.stub, request))[-1].prefill_ready.kv_session
    aborted = await prefill.stub.Abort(pb.AbortRequest(kv_session=session))
    assert aborted.status == pb.ABORT_STATUS_ALREADY_FINISHED
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await prefill.stub.Abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="123456789")))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
