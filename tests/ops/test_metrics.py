"""Prometheus metrics over a real HTTP socket, every family checked against the traffic that made it.

A gateway serves its metrics on a port of its own; the test drives Generate streams (finished,
aborted, queued, refused, left by their client), Embed, a KV subscription, then scrapes
``/metrics`` with urllib and parses it with ``prometheus_client.parser``. Each figure is
compared with what the client itself saw (status codes, token messages, usage), so a metric
that drifts from the traffic fails here.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth
from openengine_gateway.server.tls import TlsFiles
from openengine_gateway.spi import KvEventBatch
from openengine_gateway.testing import RunningGateway, serve_backends
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import FakeBackend
from tests.ops.certs import Certificates
from tests.ops.streams import ending
from tests.ops.support import gateway, wait_until

P = "openengine_gateway"
METRICS = ServerOptions(metrics_port=0)
FAST_MONITOR = GatewayOptions(health_poll_s=0.05)


class Scrape:
    """One parsed ``/metrics`` page: sample values by sample name and labels."""

    def __init__(self, text: str) -> None:
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self._samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in self.families.values()
            for sample in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        """The sample's value; a missing sample fails with the names that do exist."""
        key = (name, tuple(sorted(labels.items())))
        assert key in self._samples, f"no sample {key}; have {sorted(n for n, _ in self._samples)}"
        return self._samples[key]

    def get(self, name: str, **labels: str) -> float | None:
        return self._samples.get((name, tuple(sorted(labels.items()))))


async def scrape(port: int, host: str = "127.0.0.1") -> Scrape:
    """GET ``/metrics`` over TCP from a worker thread (the exporter serves from its own thread)."""

    def get() -> str:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            return str(response.read().decode())

    return Scrape(await asyncio.to_thread(get))


async def scrape_until(port: int, ready: Callable[[Scrape], bool], within_s: float = 5.0) -> Scrape:
    """Scrape until ``ready`` holds (counters written as a call unwinds land a moment after its status)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not ready(page := await scrape(port)):
        if loop.time() > deadline:
            raise AssertionError(f"the metrics never settled within {within_s}s")
        await asyncio.sleep(0.02)
    return page


def metrics_port(running: RunningGateway) -> int:
    port = running.server.metrics_port
    assert port is not None, "the gateway was not asked to serve metrics"
    return port


def generate(request_id: str, max_tokens: int) -> pb.GenerateRequest:
    stopping = pb.StoppingOptions(max_tokens=max_tokens, ignore_eos=True)
    return pb.GenerateRequest(request_id=request_id, model="mock", prompt="the quick brown fox", stopping=stopping)


async def rest(call: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:  # type: ignore[type-arg]
    """The call's remaining messages, read with ``read`` (so a first ``read`` may precede it)."""
    messages: list[pb.GenerateResponse] = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


def token_messages(responses: list[pb.GenerateResponse]) -> int:
    return sum(1 for response in responses if response.HasField("token"))


async def test_every_family_follows_the_traffic() -> None:
    """Finished, refused, queued and aborted streams, an Embed and a KV subscriber, each figure exact."""
    async with gateway(
        options=FAST_MONITOR, server=METRICS, decode_time_per_step_s=0.005, max_running_requests=1
    ) as running:
        stub, port = running.stub, metrics_port(running)
        streams: list[list[pb.GenerateResponse]] = []
        for number, max_tokens in enumerate((3, 5, 8)):
            streams.append([response async for response in stub.Generate(generate(f"ok-{number}", max_tokens))])
        assert all(ending(stream).error is None for stream in streams)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(pb.GenerateRequest(model="no-such-model", prompt="x")):
                pass
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND

        embed = pb.EmbedRequest(
            context=pb.TaskRequestContext(request_id="embed", model="mock"),
            inputs=[pb.TaskInput(item_id="a", text="x")],
        )
        await stub.Embed(embed)

        # One stream runs and one waits behind it (the engine runs one at a time); a KV subscriber is open.
        running_call, queued_call = stub.Generate(generate("runs", 1000)), stub.Generate(generate("waits", 1000))
        first = await running_call.read()
        subscription = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        await wait_until(lambda: running.gateway.events.kv.subscriber_count == 1, what="a KV subscriber")
        await wait_until(
            lambda: (
                (load := running.gateway.monitor.load.get("mock")) is not None
                and (load.running_requests, load.queued_requests) == (1, 1)
            ),
            what="the engine's load polled with one running and one queued",
        )
        busy = await scrape(port)
        assert busy(f"{P}_in_flight_requests") == 2
        assert busy(f"{P}_engine_running_requests", model="mock") == 1
        assert busy(f"{P}_engine_queued_requests", model="mock") == 1
        assert busy(f"{P}_event_subscribers", stream="kv") == 1
        assert busy(f"{P}_event_subscribers", stream="runtime") == 0

        for request_id in ("waits", "runs"):  # the queued one first, so it never starts
            assert (await stub.Abort(pb.AbortRequest(request_id=request_id))).status == pb.ABORT_STATUS_ABORTED
        aborted = [[first, *await rest(running_call)], await rest(queued_call)]
        for stream in aborted:
            assert set(ending(stream).reasons.values()) == {pb.FINISH_REASON_CANCELLED}
        subscription.cancel()
        streams += aborted

        page = await scrape_until(
            port,
            lambda page: (
                page.get(f"{P}_requests_total", rpc="SubscribeKvEvents", code="CANCELLED") == 1
                and page.get(f"{P}_in_flight_requests") == 0
                and page.get(f"{P}_request_outcomes_total", kind="generate", outcome="aborted") == 2
            ),
        )

    requests = {
        (sample.labels["rpc"], sample.labels["code"]): sample.value
        for sample in page.families[f"{P}_requests"].samples
        if sample.name.endswith("_total")
    }
    assert requests == {
        ("Generate", "OK"): 5,  # an aborted stream still ends with status OK and its terminal events
        ("Generate", "NOT_FOUND"): 1,
        ("Embed", "OK"): 1,
        ("Abort", "OK"): 2,
        ("SubscribeKvEvents", "CANCELLED"): 1,
    }
    assert page(f"{P}_in_flight_requests") == 0
    assert page(f"{P}_event_subscribers", stream="kv") == 0

    outcomes = {"finished": 3, "failed": 0, "aborted": 2, "cancelled": 0}
    for outcome, count in outcomes.items():
        assert page(f"{P}_request_outcomes_total", kind="generate", outcome=outcome) == count, outcome
    assert page(f"{P}_request_outcomes_total", kind="task", outcome="finished") == 1

    # One TTFT per stream that sent a token, one ITL per later token message: the client's own count.
    messages = [token_messages(stream) for stream in streams]
    assert messages[-1] == 0 and all(messages[:-1]), messages  # the queued stream was aborted before a token
    assert_histogram(page, f"{P}_time_to_first_token_seconds", sum(1 for n in messages if n))
    assert_histogram(page, f"{P}_inter_token_latency_seconds", sum(n - 1 for n in messages if n))

    # Tokens in and out: the sum of the usage every stream's final message reported (Embed is not a stream).
    usages = [ending(stream).usage for stream in streams]
    assert page(f"{P}_prompt_tokens_total") == sum(u.prompt_tokens for u in usages if u is not None) > 0
    assert page(f"{P}_completion_tokens_total") == sum(u.completion_tokens for u in usages if u is not None) > 0

    states = {s.labels["state"]: s.value for s in page.families[f"{P}_engine_health"].samples}
    assert states == {"STARTING": 0, "READY": 1, "DEGRADED": 0, "DRAINING": 0, "NOT_READY": 0}
    assert page(f"{P}_serving") == 1


def assert_histogram(page: Scrape, name: str, count: int) -> None:
    """``count`` observations, cumulative buckets ending at +Inf with all of them, a positive sum."""
    assert page(f"{name}_count") == count, name
    buckets = [(s.labels["le"], s.value) for s in page.families[name].samples if s.name == f"{name}_bucket"]
    assert buckets[-1] == ("+Inf", count)
    values = [value for _, value in buckets]
    assert values == sorted(values), f"{name} buckets are not cumulative: {buckets}"
    assert page(f"{name}_sum") > 0 or count == 0


async def test_clients_that_leave_are_counted_cancelled() -> None:
    async with gateway(server=METRICS, decode_time_per_step_s=0.005) as running:
        stub, port = running.stub, metrics_port(running)
        cancelled = stub.Generate(generate("cancelled", 1000))
        await cancelled.read()
        cancelled.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as late:
            async for _ in stub.Generate(generate("late", 1000), timeout=0.2):
                pass
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # A cancelled request keeps its slot until its engine has aborted it (core.aborts): a moment later.
        page = await scrape_until(
            port,
            lambda page: (
                page.get(f"{P}_request_outcomes_total", kind="generate", outcome="cancelled") == 2
                and page(f"{P}_in_flight_requests") == 0
            ),
        )
        assert page(f"{P}_requests_total", rpc="Generate", code="CANCELLED") == 1
        assert page(f"{P}_requests_total", rpc="Generate", code="DEADLINE_EXCEEDED") == 1


async def test_refused_calls_are_counted_and_probes_are_not() -> None:
    server = ServerOptions(metrics_port=0, auth=TokenAuth(["inference-token"], ["control-token"]))
    async with gateway(server=server) as running:
        stub, port = running.stub, metrics_port(running)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetEngineInfo(pb.GetEngineInfoRequest())
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Drain(pb.DrainRequest()).read()
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Drain(pb.DrainRequest(), metadata=(("authorization", "Bearer inference-token"),)).read()
        await health_pb2_grpc.HealthStub(running.channel).Check(health_pb2.HealthCheckRequest())
        page = await scrape_until(
            port, lambda page: page.get(f"{P}_requests_total", rpc="Drain", code="PERMISSION_DENIED") == 1
        )
    assert page(f"{P}_requests_total", rpc="GetEngineInfo", code="UNAUTHENTICATED") == 1
    assert page(f"{P}_requests_total", rpc="Drain", code="UNAUTHENTICATED") == 1
    rpcs = {sample.labels["rpc"] for sample in page.families[f"{P}_requests"].samples}
    assert rpcs == {"GetEngineInfo", "Drain"}, "grpc.health.v1 probes are not OpenEngine RPCs"


async def test_a_slow_kv_subscriber_is_dropped_and_counted() -> None:
    """A subscriber that lets its queue fill is ended and counted; a lost batch counts as a gap."""
    backend = FakeBackend(publishes_kv_events=True)
    options = GatewayOptions(subscriber_queue=4)
    async with serve_backends([("m", backend)], options=options, server_options=METRICS) as running:
        stub, port, hub = running.stub, metrics_port(running), running.gateway.events.kv
        slow = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        await wait_until(lambda: hub.subscriber_count == 1, what="a KV subscriber")
        assert (await scrape(port))(f"{P}_event_subscribers", stream="kv") == 1
        for _ in range(20):  # published in one loop turn: faster than any subscriber drains
            backend.kv_queue.put_nowait(KvEventBatch())
        await wait_until(lambda: hub.dropped_subscribers == 1, what="the slow subscriber dropped")
        received = [response async for response in slow]
        assert received[-1].HasField("error") and received[-1].error.retryable

        gapped = stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        await wait_until(lambda: hub.subscriber_count == 1, what="a second KV subscriber")
        for sequence in (1, 2, 5):  # the engine's publisher lost batches 3 and 4
            backend.kv_queue.put_nowait(KvEventBatch(sequence_number=sequence))
        assert [r async for r in gapped][-1].HasField("error")
        page = await scrape(port)
    assert page(f"{P}_event_subscribers_dropped_total", stream="kv") == 1
    assert page(f"{P}_event_subscribers_dropped_total", stream="runtime") == 0
    assert page(f"{P}_kv_event_gaps_total") == 1
    assert page(f"{P}_event_subscribers", stream="kv") == 0


async def test_engine_health_and_serving_follow_an_engine_failure() -> None:
    async with gateway(options=FAST_MONITOR, server=METRICS) as running:
        port = metrics_port(running)
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        assert (await scrape(port))(f"{P}_engine_health", model="mock", state="READY") == 1
        backend.fail("killed by the test")
        page = await scrape_until(
            port, lambda page: page.get(f"{P}_engine_health", model="mock", state="NOT_READY") == 1
        )
        assert page(f"{P}_engine_health", model="mock", state="READY") == 0
        assert page(f"{P}_serving") == 0
        backend.restart()
        page = await scrape_until(port, lambda page: page.get(f"{P}_engine_health", model="mock", state="READY") == 1)
        assert page(f"{P}_serving") == 1


@pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux routing all of 127.0.0.0/8 to loopback")
@pytest.mark.parametrize(
    ("host", "bound", "other"),
    [(None, "127.0.0.1", "127.0.0.2"), ("127.0.0.2", "127.0.0.2", "127.0.0.1"), ("[::1]", "[::1]", "127.0.0.1")],
)
async def test_the_metrics_port_binds_only_the_host_it_was_told(host: str | None, bound: str, other: str) -> None:
    """Loopback by default, ``metrics_host`` when given; closed once the gateway stops.

    A socket bound to one loopback address refuses connections on another, which a wildcard
    bind (``0.0.0.0``, ``::``) would accept.
    """
    if host == "[::1]" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = ServerOptions(metrics_port=0) if host is None else ServerOptions(metrics_port=0, metrics_host=host)
    async with gateway(server=server) as running:
        port = metrics_port(running)
        assert (await scrape(port, bound))(f"{P}_serving") == 1
        with pytest.raises(urllib.error.URLError):
            await scrape(port, other)
    with pytest.raises(urllib.error.URLError):
        await scrape(port, bound)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_the_metrics_port_can_serve_the_gateways_tls(mutual: bool, certificates: Certificates) -> None:
    """``metrics_tls``: HTTPS with the gateway's certificate; with its client CA, only its clients."""
    ca = certificates.ca.cert_file if mutual else None
    tls = TlsFiles(certificates.server.cert_file, certificates.server.key_file, ca)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certificates.ca.cert,
        private_key=certificates.client.key if mutual else None,
        certificate_chain=certificates.client.cert if mutual else None,
    )
    server = ServerOptions(tls=tls, metrics_port=0, metrics_tls=True)
    async with gateway(server=server, credentials=credentials) as running:
        port = metrics_port(running)
        trusting = ssl.create_default_context(cafile=str(certificates.ca.cert_file))
        if mutual:
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                await asyncio.to_thread(_get, f"https://127.0.0.1:{port}/metrics", trusting)
            trusting.load_cert_chain(certificates.client.cert_file, certificates.client.key_file)
        page = await asyncio.to_thread(_get, f"https://127.0.0.1:{port}/metrics", trusting)
        assert f"{P}_serving" in page
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics", None)


def _get(url: str, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return str(response.read().decode())


async def test_no_metrics_port_unless_asked() -> None:
    async with gateway() as running:
        assert running.server.metrics_port is None


async def test_a_metrics_port_in_use_is_an_error_that_names_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            async with gateway(server=ServerOptions(metrics_port=port)):
                pass
