"""What TensorRT-LLM's own OpenEngine servicer tests expect of a server, asked of the gateway's later layout.

NVIDIA/TensorRT-LLM ``tests/unittest/grpc/openengine/`` (``test_server.py``'s RPC table, ``test_control.py``
and ``test_servicer.py``, in the releases that vendor upstream at b8d052fe) check its servicer over
``openengine.v1.Inference`` and ``openengine.v1.Control``. The facts they check carry over to any server of
that layout; the code does not (theirs stubs an ``LLM``, this runs the real gateway command on the mock).
Each row is one RPC call and what those tests expect of its answer. The facts that are TensorRT-LLM's own
choices (LoRA and KV-session aborts UNIMPLEMENTED, its engine name) are left out: the mock serves LoRA.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from openengine_gateway import pb_later

from tests.process import gateway_process

MODEL = "mock-model"
CONTEXT = 1536
RUNNING = 64
"""The mock's ``max_running_requests``: DeploymentCapacity.max_running_requests."""
LONG = 1000


@dataclass
class Served:
    """The gateway's later-layout stubs."""

    address: str
    inference: pb_later.InferenceStub
    control: pb_later.ControlStub


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """The real command on the mock, decoding at 50 tokens/s so that a long request is still running when aborted."""
    args = ("--backend", "mock", "--max-context-length", str(CONTEXT), "--decode-time-per-step-s", "0.02")
    directory = tmp_path_factory.mktemp("trtllm-table")
    async with gateway_process(*args, cwd=directory) as gateway, grpc.aio.insecure_channel(gateway.address) as channel:
        yield Served(gateway.address, pb_later.InferenceStub(channel), pb_later.ControlStub(channel))


def generate_request(request_id: str, max_tokens: int) -> pb_later.GenerateRequest:
    return pb_later.GenerateRequest(
        request_id=request_id,
        model=MODEL,
        token_ids=pb_later.TokenIds(ids=list(b"the quick brown fox")),
        sampling=pb_later.SamplingParams(temperature=0.0),
        stopping=pb_later.StoppingOptions(max_tokens=max_tokens, ignore_eos=True),
    )


async def generate_streams_tokens_then_finished_with_usage(served: Served) -> None:
    responses = [r async for r in served.inference.Generate(generate_request("table-generate", 8), timeout=60)]
    events = [r.WhichOneof("event") for r in responses]
    assert events[-1] == "finished" and set(events[:-1]) <= {"prompt", "token"}, events
    assert responses[-1].finished.reason == pb_later.FINISH_REASON_LENGTH
    tokens = [t.token_id for r in responses if r.WhichOneof("event") == "token" for t in r.token.tokens]
    assert len(tokens) == 8 and all(r.request_id == "table-generate" for r in responses)
    assert (responses[-1].usage.prompt_tokens, responses[-1].usage.completion_tokens) == (19, 8)


async def server_info_reports_identity_revision_and_capacity(served: Served) -> None:
    info = await served.control.GetServerInfo(pb_later.GetServerInfoRequest(), timeout=30)
    assert info.engine_name and info.instance_id and list(info.supported_models) == [MODEL]
    assert (info.schema_revision, info.minimum_client_revision) == (1, 1)
    assert info.schema_release == pb_later.SCHEMA_RELEASE
    assert info.capacity.max_running_requests == RUNNING and info.capacity.kv_block_size == 16


async def model_info_reports_the_context_window(served: Served) -> None:
    """A client sizes its default max_tokens against it (Dynamo's sidecar does): the engine's real window."""
    info = await served.control.GetModelInfo(pb_later.GetModelInfoRequest(model=MODEL), timeout=30)
    assert info.model_id == MODEL and info.max_context_length == CONTEXT
    assert info.supports_token_ids_input is True


async def health_is_ready(served: Served) -> None:
    response = await served.control.Health(pb_later.HealthRequest(), timeout=30)
    assert response.state == pb_later.HEALTH_STATE_READY


@contextlib.asynccontextmanager
async def running(served: Served, request_id: str) -> AsyncIterator[Any]:
    """A Generate call of 1000 tokens (20 s at the mock's pace) that has streamed its first token."""
    call = served.inference.Generate(generate_request(request_id, LONG), timeout=120)
    try:
        while (await call.read()).WhichOneof("event") != "token":
            pass
        yield call
    finally:
        call.cancel()


async def get_load_counts_in_flight_requests(served: Served) -> None:
    async with running(served, "table-load"):
        load = await served.control.GetLoad(pb_later.GetLoadRequest(), timeout=30)
    assert load.running_requests == 1 and load.instance_id and load.timestamp_unix_nanos > 0


async def abort_by_request_id_aborts_the_request(served: Served) -> None:
    async with running(served, "table-abort") as call:
        aborted = await served.control.Abort(pb_later.AbortRequest(request_id="table-abort"), timeout=30)
        assert aborted.status == pb_later.ABORT_STATUS_ABORTED
        rest = []  # the stream ends: bounded by the call's timeout, well before its 1000 tokens
        while (response := await call.read()) is not grpc.aio.EOF:
            rest.append(response)
    tokens = sum(len(r.token.tokens) for r in rest if r.WhichOneof("event") == "token")
    assert tokens < LONG and rest[-1].WhichOneof("event") == "finished", rest[-1:]
    assert rest[-1].finished.reason != pb_later.FINISH_REASON_LENGTH


async def abort_of_a_finished_request_reports_already_finished(served: Served) -> None:
    """The caller's intent already holds, so it is not an error. (TensorRT-LLM says so of any id it does not know;
    the contract says NOT_FOUND for an id never seen, and the gateway remembers the ids that finished.)"""
    [_ async for _ in served.inference.Generate(generate_request("table-done", 2), timeout=60)]
    response = await served.control.Abort(pb_later.AbortRequest(request_id="table-done"), timeout=30)
    assert response.status == pb_later.ABORT_STATUS_ALREADY_FINISHED


async def abort_without_a_target_is_invalid(served: Served) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await served.control.Abort(pb_later.AbortRequest(), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


ROWS: dict[str, Callable[[Served], Awaitable[None]]] = {
    "Inference/Generate": generate_streams_tokens_then_finished_with_usage,
    "Control/GetServerInfo": server_info_reports_identity_revision_and_capacity,
    "Control/GetModelInfo": model_info_reports_the_context_window,
    "Control/GetLoad": get_load_counts_in_flight_requests,
    "Control/Health": health_is_ready,
    "Control/Abort(request_id)": abort_by_request_id_aborts_the_request,
    "Control/Abort(finished)": abort_of_a_finished_request_reports_already_finished,
    "Control/Abort(no target)": abort_without_a_target_is_invalid,
}


@pytest.mark.parametrize("row", ROWS, ids=list(ROWS))
async def test_trtllm_servicer_table(served: Served, row: str) -> None:
    await asyncio.wait_for(ROWS[row](served), 120)
