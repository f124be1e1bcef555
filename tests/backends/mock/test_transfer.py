"""Prefill → decode handoff over the loopback transfer, with its cleanup and failure paths."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from openengine_backends.mock import MockBackend
from openengine_backends.mock.transfer import TRANSFER_BACKEND
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument
from openengine_gateway.spi import Endpoint, KvSession, Sampling, Stopping

from .support import engine, generate, request

PROMPT = "Disaggregated serving splits prefill from decode."  # 49 bytes + BOS = 50 tokens
GREEDY = Sampling(temperature=0.0)


async def prefill(backend: MockBackend, prompt: str = PROMPT) -> KvSession:
    result = await generate(backend, prompt=prompt, sampling=Sampling(num_sequences=3))
    assert result.prefill is not None and result.finished == {} and result.tokens == {}
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (50, 0)
    return result.prefill.session


async def test_decode_continues_a_prefill_exactly() -> None:
    async with engine(role="prefill") as prefiller, engine(role="decode") as decoder, engine() as aggregated:
        session = await prefill(prefiller)
        assert session.transfer_backend == TRANSFER_BACKEND and session.endpoints[0].protocol == "tcp"
        assert (await prefiller.load()).active_kv_sessions == 1
        assert (await prefiller.load()).used_kv_blocks == 4
        decoded = await generate(decoder, prompt=PROMPT, kv_session=session, sampling=GREEDY)
        local = await generate(aggregated, prompt=PROMPT, sampling=GREEDY)
        load = await prefiller.load()
    assert decoded.tokens == local.tokens
    assert decoded.usage is not None and decoded.usage.cached_prompt_tokens == 48
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)


async def test_a_wildcard_transfer_bind_advertises_this_host_s_name() -> None:
    """0.0.0.0 is where to listen, not where a decode engine on another machine can connect."""
    import socket

    async with engine(role="prefill", kv_transfer_host="0.0.0.0") as prefiller:
        (endpoint,) = (await prefill(prefiller)).endpoints
    assert endpoint.host == socket.getfqdn() != "0.0.0.0" and endpoint.port > 0


async def test_a_session_is_pulled_once() -> None:
    async with engine(role="prefill") as prefiller, engine(role="decode") as decoder:
        session = await prefill(prefiller)
        await generate(decoder, prompt=PROMPT, kv_session=session)
        with pytest.raises(EngineFailure) as failure:
            await generate(decoder, prompt=PROMPT, kv_session=session)
    assert failure.value.code == pb.ERROR_CODE_KV_SESSION_NOT_FOUND and not failure.value.retryable


async def test_sessions_time_out_and_abort() -> None:
    async with engine(role="prefill", kv_session_timeout_s=0.05) as prefiller:
        await prefill(prefiller)
        kept = await prefill(prefiller, PROMPT.upper())
        assert (await prefiller.load()).active_kv_sessions == 2
        assert await prefiller.abort_kv_session(kept.session_id)
        assert not await prefiller.abort_kv_session(kept.session_id)
        await asyncio.sleep(0.1)
        load = await prefiller.load()
        assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)
        await prefill(prefiller)
        await prefill(prefiller, PROMPT.lower())
        assert await prefiller.abort_all_kv_sessions() == 2


async def test_transfer_failures_are_retryable_errors() -> None:
    async with engine(role="decode", kv_transfer_timeout_s=0.5) as decoder, engine(role="prefill") as prefiller:
        session = await prefill(prefiller)
        port = session.endpoints[0].port
        await prefiller.stop()
        with pytest.raises(EngineFailure) as failure:
            await generate(decoder, prompt=PROMPT, kv_session=session)
        assert failure.value.code == pb.ERROR_CODE_KV_TRANSFER_FAILED and failure.value.retryable
        assert str(port) in failure.value.message
        assert (await decoder.load()).queued_requests == 0


async def test_a_session_for_another_prompt_or_adapter_is_rejected() -> None:
    async with engine(role="prefill") as prefiller, engine(role="decode") as decoder:
        session = await prefill(prefiller)
        with pytest.raises(EngineFailure) as failure:
            await generate(decoder, prompt=PROMPT + "!", kv_session=session)
    assert failure.value.code == pb.ERROR_CODE_INVALID_ARGUMENT


async def test_decode_validates_the_session_before_acceptance() -> None:
    session = KvSession("s", TRANSFER_BACKEND, (Endpoint("127.0.0.1", 1, "tcp"),))
    async with engine(role="decode") as decoder:
        with pytest.raises(InvalidArgument, match="transfer_backend"):
            await generate(decoder, kv_session=dataclasses.replace(session, transfer_backend="nixl"))
        with pytest.raises(InvalidArgument, match="tcp endpoint"):
            await generate(decoder, kv_session=dataclasses.replace(session, endpoints=(Endpoint("h", 1, "rdma"),)))
        # without a session (the health probe) a decode engine generates locally
        local = await generate(decoder, stopping=Stopping(max_tokens=1))
    assert local.finished[0].reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)


async def test_aborting_a_decode_during_its_pull_cancels_it() -> None:
    async with engine(role="decode") as decoder:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
        port = server.sockets[0].getsockname()[1]
        session = KvSession("s", TRANSFER_BACKEND, (Endpoint("127.0.0.1", port, "tcp"),))
        stream = decoder.generate(request(kv_session=session))
        await asyncio.sleep(0.02)
        assert (await decoder.load()).queued_requests == 1
        (pending,) = decoder.cores[0].waiting
        await decoder.abort(pending.request_id)
        assert pending.transfer is not None
        await asyncio.sleep(0)
        assert pending.transfer.cancelled() and stream.cancelled
        server.close()
        await server.wait_closed()
