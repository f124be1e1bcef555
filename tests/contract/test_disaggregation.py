"""Prefill → decode across two gateways: the handoff, and cleanup on abort, timeout and transfer failure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from openengine_gateway import pb
from openengine_gateway.conformance import Stream
from openengine_gateway.conformance.checks.abort import cancelled_cleanly

from .conftest import Served, serve

PROMPT = "Split serving across two gateways."  # 34 bytes + BOS: two full 16-token blocks


@contextlib.asynccontextmanager
async def pair(**prefill: object) -> AsyncIterator[tuple[Served, Served]]:
    async with (
        serve(role="prefill", **prefill) as prefiller,
        serve(role="decode", kv_transfer_timeout_s=1.0) as decoder,
    ):
        yield prefiller, decoder


def request(served: Served, **options: object) -> pb.GenerateRequest:
    built = served.target.prompt(temperature=0.0, **options)
    built.prompt = PROMPT
    return built


async def prefill(served: Served) -> pb.KvSessionRef:
    stream = (await served.target.run(request(served, max_tokens=8))).succeeded()
    assert [m.WhichOneof("event") for m in stream.messages] == ["prefill_ready"]
    assert stream.usage.prompt_tokens == 35 and stream.usage.completion_tokens == 0
    return stream.last.prefill_ready.kv_session


def decode_request(served: Served, session: pb.KvSessionRef, **options: object) -> pb.GenerateRequest:
    built = request(served, **options)
    built.kv.session.CopyFrom(session)
    return built


def failed(stream: Stream) -> pb.EngineError:
    """The one terminal EngineError of a failed stream, with nothing after it."""
    assert stream.last.WhichOneof("event") == "error" and len(stream.events("error")) == 1
    assert stream.last.HasField("usage") and not stream.events("finished")
    return stream.last.error


async def test_a_prefill_hands_its_kv_to_a_decode_gateway() -> None:
    async with pair() as (prefiller, decoder), serve() as aggregated:
        session = await prefill(prefiller)
        assert (await prefiller.client.load()).active_kv_sessions == 1
        decoded = (
            await decoder.target.run(decode_request(decoder, session, max_tokens=12, ignore_eos=True))
        ).succeeded()
        local = (await aggregated.target.run(request(aggregated, max_tokens=12, ignore_eos=True))).succeeded()
        load = await prefiller.client.load()
    assert decoded.token_ids() == local.token_ids() and decoded.text() == local.text()
    assert decoded.usage.cached_prompt_tokens == 32 and decoded.usage.prompt_tokens == 35
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)


async def test_an_aborted_session_is_released_and_cannot_be_decoded() -> None:
    async with pair() as (prefiller, decoder):
        session = await prefill(prefiller)
        aborted = await prefiller.client.abort(pb.AbortRequest(kv_session=session))
        load = await prefiller.client.load()
        stream = await decoder.target.run(decode_request(decoder, session, max_tokens=4))
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)
    error = failed(stream)
    assert error.code == pb.ERROR_CODE_KV_SESSION_NOT_FOUND and not error.retryable


async def test_an_unpulled_session_times_out_and_is_released() -> None:
    async with pair(kv_session_timeout_s=0.2) as (prefiller, decoder):
        session = await prefill(prefiller)
        await asyncio.sleep(0.4)
        load = await prefiller.client.load()
        stream = await decoder.target.run(decode_request(decoder, session, max_tokens=4))
    assert (load.active_kv_sessions, load.used_kv_blocks) == (0, 0)
    assert failed(stream).code == pb.ERROR_CODE_KV_SESSION_NOT_FOUND


async def test_a_transfer_failure_is_one_retryable_engine_error() -> None:
    async with pair() as (prefiller, decoder):
        session = await prefill(prefiller)
        await prefiller.backend.sessions.stop()  # the prefill engine's transfer server goes away
        stream = await decoder.target.run(decode_request(decoder, session, max_tokens=4))
        load = await decoder.client.load()
    error = failed(stream)
    assert error.code == pb.ERROR_CODE_KV_TRANSFER_FAILED and error.retryable and error.HasField("retry_after_ms")
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)


async def test_aborting_a_session_stops_the_decode_attached_to_it() -> None:
    async with pair() as (prefiller, decoder):
        session = await prefill(prefiller)
        call = decoder.target.open_call(decode_request(decoder, session, max_tokens=900, ignore_eos=True))
        await call.first()
        aborted = await decoder.client.abort(pb.AbortRequest(kv_session=session))
        stream = await call.rest()
        load = await decoder.client.load()
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    cancelled_cleanly(stream)
    assert (load.running_requests, load.used_kv_blocks) == (0, 0)


async def test_an_aborted_prefill_ends_with_one_cancelled_error_and_holds_nothing() -> None:
    async with serve(role="prefill", prefill_time_per_token_s=0.02) as prefiller:
        built = request(prefiller)
        call = prefiller.target.open_call(built)
        await asyncio.sleep(0.2)  # prefilling 35 tokens takes 0.7 s
        aborted = await prefiller.client.abort(pb.AbortRequest(request_id=built.request_id))
        stream = await call.rest()
        load = await prefiller.client.load()
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    assert failed(stream).code == pb.ERROR_CODE_CANCELLED
    assert (load.active_kv_sessions, load.used_kv_blocks, load.running_requests) == (0, 0, 0)
