"""A hostile client against a shared endpoint: what it sends must not leak, crash or starve.

Each test is a client doing what a buggy or malicious one would, over real gRPC (or raw
HTTP/2 where grpc's own client refuses to send it): malformed metadata, oversized fields,
another token's requests, a client that reads slowly or never. The gateway must answer each
with a clear status, keep every secret out of its log, and keep serving everyone else.

It runs with the rest of ``tests/`` in CI (``make test``); the README quotes its test count.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth
from prometheus_client import generate_latest

from tests.ops.raw_h2 import frame, never_reading, raw_call
from tests.ops.support import CALLS, OPEN, engine_idle, free_port, gateway, outcome, wait_until
from tests.process import gateway_process

TOKEN = "hostile-5ecret-d1stinct-41c9"
"""A token no log line could contain by accident."""
_PATH = f"/{pb.SERVICE_NAME}/GetLoad"


def _bad_bearer(token: str) -> list[tuple[bytes, bytes]]:
    """An ``authorization`` header with the token and one byte that is not UTF-8."""
    return [(b"authorization", b"Bearer " + token.encode() + b"\xff")]


async def test_a_metadata_value_that_is_not_utf8_never_logs_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for client_side in ("hpack", "h2"):  # the raw client's own DEBUG lines quote what it sent
        caplog.set_level(logging.INFO, logger=client_side)
    async with gateway(server=ServerOptions(auth=TokenAuth([TOKEN]))) as running:
        port = running.server.port
        answer = await asyncio.to_thread(raw_call, port, _PATH, _bad_bearer(TOKEN))
        other = await asyncio.to_thread(raw_call, port, _PATH, [(b"x-trace", TOKEN.encode() + b"\xfe")])
    assert answer[b"grpc-status"] == b"16" and other[b"grpc-status"] == b"16"  # UNAUTHENTICATED
    assert "d1stinct" not in caplog.text
    assert "not UTF-8" in caplog.text  # the event itself is kept, at WARNING, without its value
    assert all(record.levelno < logging.ERROR for record in caplog.records)


async def test_the_command_logs_no_token_from_undecodable_metadata(tmp_path: Path) -> None:
    """The real command's stderr, with its own log setup, at DEBUG and with grpc's tracing on."""
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    args = ("--backend", "mock", "--log-level", "DEBUG", "--auth-token-file", str(token_file))
    async with gateway_process(*args, cwd=tmp_path) as process:
        port = int(process.address.rsplit(":", 1)[1])
        answer = await asyncio.to_thread(raw_call, port, _PATH, _bad_bearer(TOKEN))
        assert await process.stop() == 0
    assert answer[b"grpc-status"] == b"16"
    text = process.log.read_text()
    assert "not UTF-8" in text
    assert "d1stinct" not in text


ALICE, BOB, OPERATOR, ROUTER = "alice-tok-1a2b3c", "bob-tok-4d5e6f", "operator-tok-7a8b9c", "router-tok-0d1e2f"


def _tenants(**settings: object) -> ServerOptions:
    """Two tenants' inference tokens, an operator's control token and a router's observer token."""
    auth = TokenAuth([("alice", ALICE), ("bob", BOB)], [("operator", OPERATOR)], [("router", ROUTER)])
    return ServerOptions(auth=auth, **settings)  # type: ignore[arg-type]


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _abort_answer(stub: pb.OpenEngineStub, request: pb.AbortRequest, token: str) -> tuple[str, str]:
    """The status (or AbortStatus) and message an Abort gets."""
    try:
        response = await stub.Abort(request, metadata=_as(token), timeout=5)
    except grpc.aio.AioRpcError as error:
        return error.code().name, error.details() or ""
    return pb.AbortStatus.Name(response.status), response.message


async def test_a_token_cannot_abort_or_even_see_another_tokens_requests() -> None:
    async with gateway(server=_tenants(), decode_time_per_step_s=0.02) as running:
        stub = running.stub
        request = pb.GenerateRequest(request_id="alice-1", model="mock", prompt="hi")
        request.stopping.max_tokens = 500
        stream = stub.Generate(request, metadata=_as(ALICE))
        await anext(aiter(stream))
        by_id = pb.AbortRequest(request_id="alice-1")
        unknown = pb.AbortRequest(request_id="nobody-1")
        # Bob gets exactly what an id nobody used gets: nothing tells him alice-1 exists.
        seen_by_bob = await _abort_answer(stub, by_id, BOB)
        never_used = await _abort_answer(stub, unknown, BOB)
        assert seen_by_bob[0] == never_used[0] == "NOT_FOUND"
        assert seen_by_bob[1] == never_used[1].replace("nobody-1", "alice-1")
        assert not running.gateway.registry.get("alice/alice-1").aborted  # type: ignore[union-attr]
        # The event streams are an observer's: a tenant cannot read every client's requests.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.SubscribeRuntimeEvents(pb.SubscribeRuntimeEventsRequest(), metadata=_as(BOB)):
                break
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Alice reaches her own; the operator (control) reaches everyone's.
        assert (await _abort_answer(stub, by_id, ALICE))[0] == "ABORT_STATUS_ABORTED"
        stream.cancel()
        assert (await _abort_answer(stub, by_id, BOB))[0] == "NOT_FOUND"  # finished: still not his
        assert (await _abort_answer(stub, by_id, OPERATOR))[0] == "ABORT_STATUS_ALREADY_FINISHED"


async def test_a_token_cannot_release_another_tokens_kv_session() -> None:
    async with gateway(server=_tenants(), role="prefill") as running:
        stub = running.stub
        request = pb.GenerateRequest(request_id="alice-prefill", model="mock", prompt="a shared prefix")
        responses = [r async for r in stub.Generate(request, metadata=_as(ALICE))]
        session = responses[-1].prefill_ready.kv_session.session_id
        assert session
        target = pb.AbortRequest(kv_session=pb.KvSessionRef(session_id=session))
        unknown = pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="no-such-session"))
        seen_by_bob = await _abort_answer(stub, target, BOB)
        never_used = await _abort_answer(stub, unknown, BOB)
        assert seen_by_bob[0] == never_used[0] == "NOT_FOUND"
        assert seen_by_bob[1] == never_used[1].replace("no-such-session", session)
        assert (await _abort_answer(stub, target, ALICE))[0] == "ABORT_STATUS_ABORTED"  # still held: released now


async def test_the_event_streams_are_the_observers_and_the_operators(tmp_path: Path) -> None:
    streams = [call for call in CALLS if call.observe]
    async with gateway(server=_tenants()) as running:
        for call in streams:
            for token in (ROUTER, OPERATOR):
                assert await outcome(running.stub, call, tmp_path, metadata=_as(token)) == OPEN, call.label
            for token in (ALICE, BOB):
                assert await outcome(running.stub, call, tmp_path, metadata=_as(token)) == "PERMISSION_DENIED"


async def test_an_oversized_generate_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with gateway(server=ServerOptions(max_message_bytes=4096, metrics_port=0)) as running:
        request = pb.GenerateRequest(model="mock", prompt="a" * 6000)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in running.stub.Generate(request, timeout=5):
                pass
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4096-byte message limit" in (refused.value.details() or "")
        sample = running.server.metrics.registry.get_sample_value(
            "openengine_gateway_requests_total", {"rpc": "Generate", "code": "RESOURCE_EXHAUSTED"}
        )
        assert len(running.gateway.registry) == 0
    assert sample == 1
    size = request.ByteSize()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(size) in r.getMessage()]
    assert len(warnings) == 1 and "Generate" in warnings[0] and "ipv4:127.0.0.1:" in warnings[0], warnings


HUGE = "x" * 100_000
"""A client string far past the 16 KiB a grpc client accepts in a status message."""


async def _status(call: object) -> tuple[str, str]:
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:  # type: ignore[attr-defined]
                pass
        else:
            await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code().name, error.details() or ""
    return "OK", ""


async def test_no_status_message_repeats_a_client_string_whole() -> None:
    """Each answer is the status the request deserves, with a message under 1 KiB that quotes a
    prefix of what was sent and its length (grpc's client would otherwise refuse the status and
    report RESOURCE_EXHAUSTED "Stream removed")."""
    async with gateway() as running:
        stub = running.stub
        answers = {
            "Generate(model)": await _status(stub.Generate(pb.GenerateRequest(model=HUGE, prompt="hi"), timeout=5)),
            "GetModelInfo(model)": await _status(stub.GetModelInfo(pb.GetModelInfoRequest(model=HUGE), timeout=5)),
            "Abort(request_id)": await _status(stub.Abort(pb.AbortRequest(request_id=HUGE), timeout=5)),
            "UnloadLora(lora_name)": await _status(stub.UnloadLora(pb.UnloadLoraRequest(lora_name=HUGE), timeout=5)),
        }
    for call, (code, message) in answers.items():
        assert code in ("NOT_FOUND", "INVALID_ARGUMENT"), (call, code)
        assert len(message.encode()) < 1024 and "100000 characters" in message, (call, message[:200])
    assert answers["Generate(model)"][0] == answers["GetModelInfo(model)"][0] == "NOT_FOUND"


SMALL = GatewayOptions(
    max_id_chars=16,
    max_stop_conditions=4,
    max_stop_chars=8,
    max_guide_chars=32,
    max_candidate_ids=3,
    max_num_sequences=2,
    max_metadata_entries=2,
    max_path_chars=64,
)
"""Bounds small enough to reach in a test; each case below sends a value at its bound and one past it."""


def _generate(**fields: object) -> pb.GenerateRequest:
    request = pb.GenerateRequest(model="mock", prompt="hi", **fields)  # type: ignore[arg-type]
    request.stopping.max_tokens = request.stopping.max_tokens or 1
    return request


def _stops(count: int, chars: int = 1) -> pb.StoppingOptions:
    return pb.StoppingOptions(max_tokens=1, conditions=[pb.StopCondition(stop_text="z" * chars)] * count)


def _candidates(count: int) -> pb.ResponseOptions:
    return pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=range(count))))


def _embed(request_id: str = "e", item_id: str = "a", entries: int = 0) -> pb.EmbedRequest:
    context = pb.TaskRequestContext(request_id=request_id, model="mock", metadata={str(n): "v" for n in range(entries)})
    return pb.EmbedRequest(context=context, inputs=[pb.TaskInput(item_id=item_id, text="x")])


def _choices(chars: int) -> pb.GuidedDecoding:
    return pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["a" * 16, "a" * (chars - 16)]))


def _adapter(chars: int) -> pb.LoadLoraRequest:
    return pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=1, lora_name="a", source_path="/" + "p" * (chars - 1)))


def _session(chars: int) -> pb.AbortRequest:
    return pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="k" * chars))


# (what, the RPC, the request for a size, the bound): the size at the bound passes it, one more does not
BOUNDS: list[tuple[str, str, Callable[[int], Any], int]] = [
    ("request_id", "Generate", lambda n: _generate(request_id="r" * n), 16),
    ("cache_salt", "Generate", lambda n: _generate(kv=pb.KvOptions(cache_salt="s" * n)), 16),
    ("lora_name", "Generate", lambda n: _generate(lora_name="l" * n), 16),
    ("stop conditions", "Generate", lambda n: _generate(stopping=_stops(n)), 4),
    ("stop string", "Generate", lambda n: _generate(stopping=_stops(1, n)), 8),
    ("guide", "Generate", lambda n: _generate(guided=pb.GuidedDecoding(regex="a" * n)), 32),
    ("choices", "Generate", lambda n: _generate(guided=_choices(n)), 32),
    ("candidate ids", "Generate", lambda n: _generate(response=_candidates(n)), 3),
    ("metadata", "Generate", lambda n: _generate(metadata={str(k): "v" for k in range(n)}), 2),
    ("sequences", "Generate", lambda n: _generate(sampling=pb.SamplingParams(num_sequences=n)), 2),
    ("task request_id", "Embed", lambda n: _embed(request_id="r" * n), 16),
    ("task item_id", "Embed", lambda n: _embed(item_id="i" * n), 16),
    ("task metadata", "Embed", lambda n: _embed(entries=n), 2),
    ("abort request_id", "Abort", lambda n: pb.AbortRequest(request_id="r" * n), 16),
    ("abort session_id", "Abort", _session, 16),
    ("unload lora_name", "UnloadLora", lambda n: pb.UnloadLoraRequest(lora_name="l" * n), 16),
    ("load source_path", "LoadLora", _adapter, 64),
]


def _bounded(message: str) -> bool:
    """A refusal by a bound: named with its flag, or (sequences) by the narrowed advertised maximum."""
    return ("this gateway accepts at most" in message and "(--max-" in message) or "advertised maximum (2)" in message


@pytest.mark.parametrize(("what", "rpc", "sized", "bound"), BOUNDS, ids=[case[0] for case in BOUNDS])
async def test_every_client_sized_field_is_bounded_at_its_edge(
    what: str, rpc: str, sized: Callable[[int], Any], bound: int
) -> None:
    async with gateway(options=SMALL) as running:
        method = getattr(running.stub, rpc)
        code, message = await _status(method(sized(bound), timeout=5))
        assert not _bounded(message), (what, code, message)
        code, message = await _status(method(sized(bound + 1), timeout=5))
        assert code == "INVALID_ARGUMENT" and _bounded(message), (what, code, message)
        assert len(running.gateway.registry) == 0


async def test_the_default_bounds_refuse_a_100_kb_request_id_and_90000_stop_strings_at_once() -> None:
    async with gateway() as running:
        huge_id = await _status(running.stub.Generate(_generate(request_id=HUGE), timeout=5))
        loop = asyncio.get_running_loop()
        started = loop.time()
        stops = await _status(running.stub.Generate(_generate(stopping=_stops(90_000)), timeout=10))
        elapsed = loop.time() - started
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model="mock"))
    assert huge_id[0] == "INVALID_ARGUMENT" and "--max-id-chars" in huge_id[1]
    assert stops[0] == "INVALID_ARGUMENT" and "--max-stop-conditions" in stops[1]
    assert elapsed < 1.0
    assert info.generation.max_num_sequences == 8  # the mock's own 8, under the default bound of 128


async def test_one_token_cannot_take_every_slot() -> None:
    options = GatewayOptions(max_in_flight=8, max_in_flight_per_token=2)
    async with gateway(server=_tenants(metrics_port=0), options=options, decode_time_per_step_s=0.02) as running:
        stub, metrics = running.stub, running.server.metrics.registry
        streams = []
        for token, count in ((ALICE, 2), (BOB, 1)):
            for _ in range(count):
                request = _generate(stopping=pb.StoppingOptions(max_tokens=500))
                stream = stub.Generate(request, metadata=_as(token))
                await anext(aiter(stream))
                streams.append(stream)
        greedy = stub.Generate(_generate(), metadata=_as(ALICE))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in greedy:
                pass
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "this token is at its limit of 2" in (refused.value.details() or "")
        assert ("retry-after-ms", "100") in tuple(refused.value.trailing_metadata() or ())
        assert [r async for r in stub.Generate(_generate(), metadata=_as(BOB))][-1].HasField("finished")

        def in_flight(name: str) -> float | None:
            return metrics.get_sample_value("openengine_gateway_token_in_flight_requests", {"token": name})

        assert (in_flight("alice"), in_flight("bob"), in_flight("operator")) == (2, 1, 0)
        refusals = {"token": "alice", "rpc": "Generate", "code": "RESOURCE_EXHAUSTED"}
        assert metrics.get_sample_value("openengine_gateway_token_requests_total", refusals) == 1
        served_bob = {"token": "bob", "rpc": "Generate", "code": "OK"}
        assert metrics.get_sample_value("openengine_gateway_token_requests_total", served_bob) == 1
        page = generate_latest(metrics).decode()
        assert all(token not in page for token in (ALICE, BOB, OPERATOR, ROUTER))
        for stream in streams:
            stream.cancel()


async def test_a_never_reading_client_holds_one_slot_and_nothing_else() -> None:
    """Its engine work completes, everyone else is served, and its slot is free once it goes away."""
    async with gateway(decode_time_per_step_s=0.001) as running:
        request = _generate(request_id="never-reads", stopping=pb.StoppingOptions(max_tokens=400))
        sock = await asyncio.to_thread(
            never_reading, running.server.port, f"/{pb.SERVICE_NAME}/Generate", frame(request)
        )
        try:
            await wait_until(lambda: running.gateway.registry.get("never-reads") is not None, what="admission")
            backend = running.gateway.engines.engine("mock").backend
            await wait_until(lambda: engine_idle(backend), what="the engine finishing its work")  # type: ignore[arg-type]
            served = [r async for r in running.stub.Generate(_generate(stopping=pb.StoppingOptions(max_tokens=20)))]
            assert served[-1].HasField("finished")
            assert len(running.gateway.registry) == 1
        finally:
            sock.close()
        await wait_until(lambda: len(running.gateway.registry) == 0, within_s=10, what="its slot freed")


async def test_a_slow_reader_gets_every_token_coalesced() -> None:
    """A client that reads one message every 20 ms from a fast engine receives the same text as
    one that keeps up, in fewer messages than tokens; the engine is never held back."""
    tokens = 200
    async with gateway(decode_time_per_step_s=0.0005) as running:

        def request() -> pb.GenerateRequest:
            return _generate(
                sampling=pb.SamplingParams(temperature=0, seed=7),
                stopping=pb.StoppingOptions(max_tokens=tokens, ignore_eos=True),
            )

        quick = [r async for r in running.stub.Generate(request())]
        slow: list[pb.GenerateResponse] = []
        # Without BDP probing and with little lookahead, the client's window stays small: reading
        # slowly is what holds the server's writes back, not a large client-side buffer.
        window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
        async with grpc.aio.insecure_channel(running.address, options=window) as narrow:
            async for response in pb.OpenEngineStub(narrow).Generate(request()):
                slow.append(response)
                await asyncio.sleep(0.02)
        assert len(running.gateway.registry) == 0

    def text(responses: list[pb.GenerateResponse]) -> str:
        return "".join(r.token.text for r in responses if r.HasField("token"))

    assert text(slow) == text(quick) and slow[-1].HasField("finished")
    assert sum(len(r.token.tokens) for r in slow if r.HasField("token")) == tokens
    assert len(slow) < tokens / 2


MALFORMED: list[tuple[str, list[tuple[bytes, bytes]]]] = [
    ("bearer without a token", [(b"authorization", b"Bearer")]),
    ("another scheme", [(b"authorization", b"Basic " + TOKEN.encode())]),
    ("a wrong token first", [(b"authorization", b"Bearer wrong"), (b"authorization", b"Bearer " + TOKEN.encode())]),
    ("a 12 KiB authorization", [(b"authorization", b"Bearer " + TOKEN.encode() + b"x" * 12_000)]),
    ("a NUL in the token", [(b"authorization", b"Bearer " + TOKEN.encode() + b"\x00")]),
    # grpc's C core refuses these two itself, as INTERNAL, before the gateway sees the call
    ("a bad -bin value", [(b"x-trace-bin", b"not base64 " + TOKEN.encode() + b"\xff!")]),
    ("a garbage deadline", [(b"grpc-timeout", b"soon " + TOKEN.encode())]),
    ("200 headers", [(f"x-h{n}".encode(), TOKEN.encode()) for n in range(200)]),
]


@pytest.mark.parametrize("headers", [case[1] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
async def test_malformed_metadata_is_refused_cleanly_and_never_logged(
    headers: list[tuple[bytes, bytes]], caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """No crash, no INTERNAL of the gateway's, no token in a log line (Python's or what grpc's C
    core writes to file descriptor 2); the gateway serves the next call."""
    caplog.set_level(logging.DEBUG)
    for client_side in ("hpack", "h2"):
        caplog.set_level(logging.INFO, logger=client_side)
    async with gateway(server=ServerOptions(auth=TokenAuth([TOKEN]))) as running:
        answer = await asyncio.to_thread(raw_call, running.server.port, _PATH, headers)
        load = await running.stub.GetLoad(pb.GetLoadRequest(), metadata=_as(TOKEN), timeout=5)
    assert load is not None
    status = answer.get(b"grpc-status")
    assert status != b"0", answer  # never admitted with a bad token
    if status == b"13":  # never the gateway's own INTERNAL: only grpc's refusal of a header it cannot parse
        assert answer[b"grpc-message"].startswith(b"Error parsing '"), answer
    assert "d1stinct" not in caplog.text
    assert "d1stinct" not in capfd.readouterr().err


async def test_the_command_serves_named_tokens_in_three_scopes(tmp_path: Path) -> None:
    """Token files with names, the observer scope and the per-token limit, from the real command line."""
    files = {"inference": "alice alice-tok-1a2b3c\nbob bob-tok-4d5e6f\n", "control": "operator operator-tok-7a8b9c\n"}
    files["observer"] = "router router-tok-0d1e2f\n"
    for scope, text in files.items():
        (tmp_path / scope).write_text(text)
        (tmp_path / scope).chmod(0o600)
    port = free_port()
    args = ["--backend", "mock", "--metrics-port", str(port), "--max-in-flight-per-token", "1"]
    args += ["--auth-token-file", "inference", "--control-token-file", "control", "--observer-token-file", "observer"]
    async with gateway_process(*args, cwd=tmp_path) as process:
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = pb.OpenEngineStub(channel)
            assert await stub.GetLoad(pb.GetLoadRequest(), metadata=_as(ROUTER), timeout=5) is not None
            for token, expected in ((ROUTER, OPEN), (BOB, "PERMISSION_DENIED")):
                call = next(call for call in CALLS if call.rpc == "SubscribeRuntimeEvents")
                assert await outcome(stub, call, tmp_path, metadata=_as(token)) == expected
            answer = await _abort_answer(stub, pb.AbortRequest(all_requests=pb.AllRequests()), ALICE)
            assert answer[0] == "PERMISSION_DENIED"

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())

        page = await asyncio.to_thread(scrape)
        assert await process.stop() == 0
    assert 'openengine_gateway_token_in_flight_requests{token="alice"} 0.0' in page
    assert 'code="PERMISSION_DENIED",rpc="SubscribeRuntimeEvents",token="bob"' in page
    log = process.log.read_text()
    assert "audit: PERMISSION_DENIED on Abort by token 'alice'" in log
    assert all(secret not in log + page for secret in (ALICE, BOB, OPERATOR, ROUTER))
