"""Abort, cancellation, health, load, LoRA, KV events and disaggregation on the fake SGLang."""

from __future__ import annotations

import asyncio
import json
import socket
import types
from pathlib import Path

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway

from tests.responses import collect, finished, text

from ..fake_serving import MODEL, serving
from . import fake_engine
from .conftest import GREEDY, request, sglang

LONG = pb.StoppingOptions(max_tokens=200, ignore_eos=True)


def manager(index: int = 0) -> fake_engine.TokenizerManager:
    return fake_engine.ENGINES[index].tokenizer_manager


async def first_token(stream: grpc.aio.UnaryStreamCall) -> None:  # type: ignore[type-arg]
    async for response in stream:
        if response.HasField("token"):
            return


async def test_abort_reaches_only_its_own_requests(fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang aborts every request id with the aborted one as a prefix: ``r1`` must not stop ``r10``."""
    monkeypatch.setattr(fake_engine, "STEP_S", 0.01)
    async with serving(sglang()) as running:
        short = running.stub.Generate(request(request_id="r1", sampling=GREEDY, stopping=LONG))
        long = running.stub.Generate(
            request(request_id="r10", sampling=GREEDY, stopping=pb.StoppingOptions(max_tokens=30, ignore_eos=True))
        )
        await first_token(short)
        answer = await running.stub.Abort(pb.AbortRequest(request_id="r1"))
        rest = [r async for r in short]
        other = [r async for r in long]
    assert answer.status == pb.ABORT_STATUS_ABORTED
    assert finished(rest)[0].reason == pb.FINISH_REASON_CANCELLED
    assert finished(other)[0].reason == pb.FINISH_REASON_LENGTH
    assert any(rid.endswith("-r1-0") for rid, _ in manager().aborts)


async def test_a_cancelled_client_stops_sglangs_request(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_engine, "STEP_S", 0.01)
    async with serving(sglang()) as running:
        call = running.stub.Generate(request(request_id="gone", sampling=GREEDY, stopping=LONG))
        await first_token(call)
        call.cancel()
        for _ in range(200):
            if not manager().rid_to_state:
                break
            await asyncio.sleep(0.01)
    assert not manager().rid_to_state, "the SGLang request was aborted"


async def test_health_by_liveness_and_probe(fake: types.ModuleType) -> None:
    async with serving(sglang()) as running:
        probed = await running.stub.Health(pb.HealthRequest(include_inference_probe=True))
        assert probed.state == pb.HEALTH_STATE_READY
        fake_engine.ENGINES[0].child_pids.append(2**22 + 1)
        dead = await running.stub.Health(pb.HealthRequest())
    assert dead.state == pb.HEALTH_STATE_NOT_READY
    assert any("exited" in check.message for check in dead.checks)


async def test_load_while_a_request_runs(fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_engine, "STEP_S", 0.01)
    async with serving(sglang(page_size=4, max_total_tokens=64)) as running:
        call = running.stub.Generate(
            request(sampling=GREEDY, stopping=pb.StoppingOptions(max_tokens=40, ignore_eos=True))
        )
        await first_token(call)
        load = await running.stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
        call.cancel()
    assert load.running_requests == 1 and load.total_kv_blocks == 16 and load.used_kv_blocks >= 1


async def test_lora_load_generate_list_unload(fake: types.ModuleType, tmp_path: Path) -> None:
    async with serving(sglang(enable_lora=True, lora_paths=["base=/adapters/base"])) as running:
        listed = await running.stub.ListLoras(pb.ListLorasRequest())
        assert [(a.lora_id, a.lora_name) for a in listed.adapters] == [(1, "base")], "SGLang's startup adapters"
        adapter = pb.LoraAdapter(lora_id=7, lora_name="tuned", source_path=str(tmp_path))
        await running.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))
        responses = await collect(running.stub, request("say", sampling=GREEDY, lora_name="tuned"))
        await running.stub.UnloadLora(pb.UnloadLoraRequest(lora_name="tuned"))
    assert text(responses) != "lo world.", "the fake adapter shifts the model"
    assert manager().received[-1].lora_path == "tuned"
    assert fake_engine.ENGINES[0].lora_calls == [("load", "tuned", str(tmp_path)), ("unload", "tuned")]


async def test_lora_is_refused_where_sglang_runs_without_it(fake: types.ModuleType, tmp_path: Path) -> None:
    async with serving(sglang()) as running:
        adapter = pb.LoraAdapter(lora_id=7, lora_name="tuned", source_path=str(tmp_path))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_runtime_lora_loading_is_refused_with_several_dp_ranks(fake: types.ModuleType, tmp_path: Path) -> None:
    """SGLang asserts dp_size 1 there: an assertion would read as an internal error."""
    async with serving(sglang(enable_lora=True, dp_size=2)) as running:
        adapter = pb.LoraAdapter(lora_id=7, lora_name="tuned", source_path=str(tmp_path))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "dp_size 1" in (error.value.details() or "")
    assert fake_engine.ENGINES[0].lora_calls == []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_kv_events_from_sglangs_publisher(fake: types.ModuleType) -> None:
    port = free_port()
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"})
    async with serving(sglang(page_size=2, kv_events_config=config)) as running:
        sources = await running.stub.GetKvEventSources(pb.GetKvEventSourcesRequest())
        assert [s.endpoint_addr.port for s in sources.sources] == [port]
        events = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        first = asyncio.ensure_future(events.read())  # awaited without a timeout: cancelling a read ends the call
        for _ in range(100):  # a SUB socket joins asynchronously: generate until a batch arrives
            await collect(running.stub, request("abcd", sampling=GREEDY))
            done, _ = await asyncio.wait({first}, timeout=0.1)
            if done:
                break
        assert first.done(), "no KV batch arrived"
        events.cancel()
    stored = first.result().batch.events[0].block_stored
    assert list(stored.token_ids) == [ord(c) for c in "abcd"] and stored.block_size == 2
    assert stored.medium == pb.STORAGE_MEDIUM_GPU and len(stored.block_hashes) == 2


async def prefill_ready(running: RunningGateway, prompt: str, **fields: object) -> pb.KvSessionRef:
    (response,) = await collect(running.stub, request(prompt, model=MODEL, **fields))  # type: ignore[arg-type]
    assert response.HasField("prefill_ready") and response.usage.prompt_tokens == len(prompt)
    return response.prefill_ready.kv_session


async def test_prefill_and_decode_meet_through_the_bootstrap_room(fake: types.ModuleType) -> None:
    """Each SGLang engine has a gateway of its own (as it must): the pair meets through SGLang's bootstrap."""
    prefill = sglang(disaggregation_mode="prefill", disaggregation_bootstrap_port=9100)
    decode = sglang(disaggregation_mode="decode")
    async with serving(prefill) as running, serving(decode) as decoding:
        session = await prefill_ready(running, "say")
        attributes = dict(session.attributes_struct)
        assert attributes["bootstrap_host"] == "127.0.0.1" and attributes["bootstrap_port"] == 9100
        assert session.transfer_backend == "mooncake" and session.endpoints[0].port == 9100
        load = await running.stub.GetLoad(pb.GetLoadRequest())
        assert load.active_kv_sessions == 1, "SGLang's prefill runs on, waiting for its decode"
        kv = pb.KvOptions(session=session)
        responses = await collect(decoding.stub, request("say", sampling=GREEDY, kv=kv))
        assert text(responses) == "lo world."
        for _ in range(200):
            if (await running.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 0:
                break
            await asyncio.sleep(0.01)
        assert (await running.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 0
    sent = manager(1).received[-1]
    assert (sent.bootstrap_host, sent.bootstrap_port) == ("127.0.0.1", 9100)
    assert sent.bootstrap_room == int(attributes["bootstrap_room"])
    assert manager(0).received[-1].bootstrap_room == sent.bootstrap_room


async def test_a_kv_session_can_be_aborted_and_a_missing_prefill_fails_the_decode(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_engine, "BOOTSTRAP_TIMEOUT_S", 0.2)
    prefill, decode = sglang(disaggregation_mode="prefill"), sglang(disaggregation_mode="decode")
    async with serving(prefill) as running, serving(decode) as decoding:
        session = await prefill_ready(running, "say")
        answer = await running.stub.Abort(pb.AbortRequest(kv_session=session))
        assert answer.status == pb.ABORT_STATUS_ABORTED
        assert (await running.stub.GetLoad(pb.GetLoadRequest())).active_kv_sessions == 0
        again = await running.stub.Abort(pb.AbortRequest(kv_session=session))
        assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED  # idempotent, as for requests
        orphan = pb.KvSessionRef(session_id="x", transfer_backend="mooncake")
        orphan.attributes_struct.update({"bootstrap_host": "nowhere", "bootstrap_port": 1, "bootstrap_room": 5})
        responses = await collect(decoding.stub, request("say", kv=pb.KvOptions(session=orphan)))
    assert responses[-1].error.code == pb.ERROR_CODE_KV_TRANSFER_FAILED


async def test_stop_aborts_everything_and_shuts_sglang_down(fake: types.ModuleType) -> None:
    backend = sglang()
    async with serving(backend):
        pass
    assert fake_engine.ENGINES[0].shut_down and ("", True) in manager().aborts
    assert manager().handle_loop_started, "SGLang's output loop started on the gateway's loop"


async def test_an_unsupported_streaming_mode_is_a_config_error(fake: types.ModuleType) -> None:
    from openengine_gateway.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="incremental_streaming_output"):
        async with serving(sglang(incremental_streaming_output=True)):
            pass
