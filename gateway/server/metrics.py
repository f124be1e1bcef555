"""Prometheus metrics of one gateway, served on their own HTTP port.

Per-RPC status counts come from the interceptor; everything else is read at scrape time
from state the gateway keeps anyway (the request registry, the engine monitor's cached
health and load, the core's telemetry, the event hubs), so scraping never calls an engine
and the streaming path never touches a Prometheus lock.

    openengine_gateway_requests_total{rpc,code}           RPCs by final gRPC status
    openengine_gateway_token_requests_total{token,rpc,code}  the same, per token name (never the token)
    openengine_gateway_in_flight_requests                 accepted requests not yet ended
    openengine_gateway_token_in_flight_requests{token}    the same, per token name (never the token)
    openengine_gateway_engine_running_requests{model}     the engine's own running count
    openengine_gateway_engine_queued_requests{model}      the engine's own queue
    openengine_gateway_time_to_first_token_seconds        histogram, acceptance to first token message
    openengine_gateway_inter_token_latency_seconds        histogram, gap between token messages
    openengine_gateway_prompt_tokens_total                tokens in (final usage of each stream)
    openengine_gateway_completion_tokens_total            tokens out
    openengine_gateway_request_outcomes_total{kind,outcome}  finished, failed, aborted, cancelled
    openengine_gateway_event_subscribers{stream}          open KV / runtime event subscriptions
    openengine_gateway_event_subscribers_dropped_total{stream}  ended for falling behind
    openengine_gateway_kv_event_gaps_total                batches an engine lost, reported to subscribers
    openengine_gateway_engine_health{model,state}         1 for the engine's current HealthState
    openengine_gateway_driver_faults_total{model,backend}  requests the driver failed by breaking the SPI
    openengine_gateway_serving                            1 while grpc.health.v1 reports SERVING
    openengine_gateway_resident_memory_bytes              the process's memory in use (what the budget checks)
    openengine_gateway_memory_budget_bytes                ``--max-memory-mib`` (absent without a budget)
    openengine_gateway_memory_shed_total                  new work refused for memory (RESOURCE_EXHAUSTED)
    openengine_gateway_health_watches                     open grpc.health.v1 Watch streams (``health_watch``)

Per engine, labelled ``engine`` (the served name of the engine that answered) and ``split`` (the split's
name when the request reached it through one, else ""), from the pair's first request on; bounded by the
configuration, never by what clients send:

    openengine_gateway_engine_requests_total{kind,outcome,code}  generate or task; finished, failed, aborted,
                                                          cancelled, rejected (by the engine's driver); the
                                                          EngineError code or gRPC status (OK when finished)
    openengine_gateway_engine_time_to_first_token_seconds  histogram, acceptance to first token message
    openengine_gateway_engine_inter_token_latency_seconds  histogram, gap between token messages
    openengine_gateway_engine_e2e_latency_seconds         histogram, acceptance to the end of the stream
    openengine_gateway_engine_queue_time_seconds          histogram, arrival to the engine's stream opened
    openengine_gateway_engine_prompt_tokens_total         tokens in
    openengine_gateway_engine_completion_tokens_total     tokens out

The gateway-wide TTFT, ITL, token and outcome families are these summed over engines.

Canaries (a split's ``analysis``), per split:

    openengine_gateway_canary_weight{split,engine}        the candidate's weight now (percent)
    openengine_gateway_canary_step{split}                 the current step, from 1
    openengine_gateway_canary_state{split,state}          1 for running, paused, promoted, rolled back or aborted
    openengine_gateway_canary_decisions_total{split,decision}  step, wait, promote, rollback, pause, resume, abort

Mirrors (``[[mirrors]]``), per pair of engines, labelled ``primary`` and ``shadow``, from a pair's first copy on:

    openengine_gateway_mirror_copies_total{outcome}       compared, shed (full), skipped (shadow refuses), cancelled
    openengine_gateway_mirror_errors_total{side,code}     compared streams that ended with an engine error
    openengine_gateway_mirror_outputs_total{basis,result}  greedy outputs, identical or diverged, in tokens or text
    openengine_gateway_mirror_divergence_position{basis}  histogram, first differing token or character
    openengine_gateway_mirror_finish_reasons_total{primary_reason,shadow_reason}  per output
    openengine_gateway_mirror_time_to_first_token_seconds{side}  histogram, request start to first token
    openengine_gateway_mirror_inter_token_latency_seconds{side}  histogram, gap between token events
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import pb
from ..core.agreement import BASES, SIDES, Agreement
from ..core.canary import DECISIONS, STATES, Canaries
from ..core.gateway import Gateway
from ..core.memory import MemoryBudget
from ..core.telemetry import Histogram, Telemetry
from .tls import TlsFiles

PREFIX = "openengine_gateway"
_HEALTH_STATES = [pb.HealthState.Name(state) for state in pb.HealthState.values() if state]


class MetricsExporter:
    """The metrics registry of one gateway and, once started, the HTTP server exposing it."""

    def __init__(self, gateway: Gateway, token_names: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            f"{PREFIX}_requests",
            "OpenEngine RPCs by method and final gRPC status",
            ("rpc", "code"),
            registry=self.registry,
        )
        self._token_requests = Counter(
            f"{PREFIX}_token_requests",
            "OpenEngine RPCs by the name of the token presented, method and final gRPC status",
            ("token", "rpc", "code"),
            registry=self.registry,
        )
        self.registry.register(_GatewayCollector(gateway, tuple(token_names)))
        self._http: MetricsServer | None = None

    def gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Expose ``read()`` at scrape time as the gauge ``openengine_gateway_NAME`` (state the server keeps)."""
        self.registry.register(_Gauge(f"{PREFIX}_{name}", documentation, read))

    def rpc_finished(self, rpc: str, code: str, token: str | None = None) -> None:
        """Count one finished RPC, and by its token's name when it had one (the interceptor's callback)."""
        self._requests.labels(rpc, code).inc()
        if token is not None:
            self._token_requests.labels(token, rpc, code).inc()

    def start(self, host: str, port: int, tls: TlsFiles | None = None) -> int:
        """Serve ``/metrics`` on ``host:port`` (``MetricsServer.start``); returns the bound port."""
        self._http = MetricsServer(self.registry)
        return self._http.start(host, port, tls)

    def stop(self) -> None:
        """Stop the HTTP server, if started."""
        if self._http is not None:
            self._http.stop()
            self._http = None


class MetricsServer:
    """The HTTP server of a registry's ``/metrics`` page."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    def start(self, host: str, port: int, tls: TlsFiles | None = None) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port), over HTTPS with ``tls`` (requiring a
        client certificate when it has a client CA); returns the bound port.

        Raises ``OSError`` naming the metrics address when it cannot be bound."""
        files: dict[str, Any] = {}
        if tls is not None:
            files = {
                "certfile": str(tls.cert_file),
                "keyfile": str(tls.key_file),
                "client_cafile": str(tls.client_ca_file) if tls.client_ca_file is not None else None,
                "client_auth_required": tls.mutual,
            }
        try:
            server, thread = start_http_server(port, host.strip("[]"), registry=self.registry, **files)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        self._http = (server, thread)
        return int(server.server_port)

    def stop(self) -> None:
        """Stop the HTTP server, if started."""
        if self._http is not None:
            server, thread = self._http
            self._http = None
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


class _Gauge(Collector):
    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._documentation, self._read())


class _GatewayCollector(Collector):
    """Reads the gateway's live state at scrape time (from the exporter's thread)."""

    def __init__(self, gateway: Gateway, token_names: tuple[str, ...]) -> None:
        self._gateway = gateway
        self._token_names = token_names
        """Every configured token's name, so that an idle token reads 0 rather than nothing."""

    def collect(self) -> Iterator[Metric]:
        gateway = self._gateway
        telemetry = gateway.telemetry
        yield GaugeMetricFamily(
            f"{PREFIX}_in_flight_requests", "Accepted requests not yet ended", len(gateway.registry)
        )
        yield self._tokens()
        yield from self._engines()
        ttft, itl = telemetry.merged("ttft"), telemetry.merged("itl")
        yield _histogram(f"{PREFIX}_time_to_first_token_seconds", "Acceptance to first token message", ttft)
        yield _histogram(f"{PREFIX}_inter_token_latency_seconds", "Gap between token messages", itl)
        yield CounterMetricFamily(f"{PREFIX}_prompt_tokens", "Prompt tokens of ended streams", telemetry.prompt_tokens)
        yield CounterMetricFamily(
            f"{PREFIX}_completion_tokens", "Completion tokens of ended streams", telemetry.completion_tokens
        )
        outcomes = CounterMetricFamily(
            f"{PREFIX}_request_outcomes", "Ended requests by kind and outcome", labels=("kind", "outcome")
        )
        for (kind, outcome), count in list(telemetry.outcomes.items()):
            outcomes.add_metric((kind, outcome), count)
        yield outcomes
        events = gateway.events
        subscribers = GaugeMetricFamily(f"{PREFIX}_event_subscribers", "Open event subscriptions", labels=("stream",))
        subscribers.add_metric(("kv",), events.kv.subscriber_count)
        subscribers.add_metric(("runtime",), events.runtime.subscriber_count)
        yield subscribers
        dropped = CounterMetricFamily(
            f"{PREFIX}_event_subscribers_dropped", "Subscriptions ended for falling behind", labels=("stream",)
        )
        dropped.add_metric(("kv",), events.kv.dropped_subscribers)
        dropped.add_metric(("runtime",), events.runtime.dropped_subscribers)
        yield dropped
        yield CounterMetricFamily(f"{PREFIX}_kv_event_gaps", "KV event gaps reported to subscribers", events.kv.gaps)
        yield from _per_engine(telemetry)
        yield from _canaries(gateway.canaries)
        yield from _mirrors(gateway.agreement)
        yield from _memory(gateway.registry.memory)

    def _tokens(self) -> Metric:
        owned = self._gateway.registry.owner_counts()
        family = GaugeMetricFamily(
            f"{PREFIX}_token_in_flight_requests", "Accepted requests not yet ended, per token name", labels=("token",)
        )
        for name in dict.fromkeys((*self._token_names, *owned)):
            family.add_metric((name,), owned.get(name, 0))
        return family

    def _engines(self) -> Iterator[Metric]:
        gateway = self._gateway
        monitor = gateway.monitor
        running = GaugeMetricFamily(f"{PREFIX}_engine_running_requests", "Requests the engine runs", labels=("model",))
        queued = GaugeMetricFamily(f"{PREFIX}_engine_queued_requests", "Requests the engine queues", labels=("model",))
        for model, load in list(monitor.load.items()):
            if load.running_requests is not None:
                running.add_metric((model,), load.running_requests)
            if load.queued_requests is not None:
                queued.add_metric((model,), load.queued_requests)
        yield running
        yield queued
        health = GaugeMetricFamily(
            f"{PREFIX}_engine_health", "1 for the engine's current health state", labels=("model", "state")
        )
        for model, state in list(monitor.health.items()):
            current = pb.HealthState.Name(state)
            for name in _HEALTH_STATES:
                health.add_metric((model, name.removeprefix("HEALTH_STATE_")), 1.0 if name == current else 0.0)
        yield health
        faults = CounterMetricFamily(
            f"{PREFIX}_driver_faults", "Requests a driver failed, breaking the backend SPI", labels=("model", "backend")
        )
        for engine in gateway.engines:
            faults.add_metric((engine.served_name, engine.faults.backend), engine.faults.count)
        yield faults
        yield GaugeMetricFamily(
            f"{PREFIX}_serving", "1 while the gateway admits requests and its engines are ready", float(gateway.serving)
        )


def _memory(budget: MemoryBudget) -> Iterator[Metric]:
    yield GaugeMetricFamily(f"{PREFIX}_resident_memory_bytes", "Resident memory of this process", budget.resident)
    if budget.limit_bytes is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}_memory_budget_bytes", "The memory budget new work is shed before", budget.limit_bytes
        )
    yield CounterMetricFamily(f"{PREFIX}_memory_shed", "New work refused for memory (RESOURCE_EXHAUSTED)", budget.shed)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.cumulative()]


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, buckets=_buckets(histogram), sum_value=histogram.total)


ENGINE_HISTOGRAMS = (
    ("time_to_first_token_seconds", "ttft", "Acceptance to first token message"),
    ("inter_token_latency_seconds", "itl", "Gap between token messages"),
    ("e2e_latency_seconds", "e2e", "Acceptance to the end of the stream"),
    ("queue_time_seconds", "queued", "Arrival in the gateway to the engine's stream opened (validation, routing)"),
)
"""Per-engine histograms: (family name after ``openengine_gateway_engine_``, ``EngineStats`` field, help)."""


def _per_engine(telemetry: Telemetry) -> Iterator[Metric]:
    """The ``openengine_gateway_engine_*`` request families, labelled by the engine that answered and the
    split it answered through ("" when addressed by its own name); present (empty) before any request."""
    engine = f"{PREFIX}_engine"
    keys = ("engine", "split")
    requests = CounterMetricFamily(
        f"{engine}_requests",
        "Requests by engine, split, kind (generate, task), outcome and code (EngineError code or gRPC status)",
        labels=(*keys, "kind", "outcome", "code"),
    )
    prompt = CounterMetricFamily(f"{engine}_prompt_tokens", "Prompt tokens of ended streams", labels=keys)
    completion = CounterMetricFamily(f"{engine}_completion_tokens", "Completion tokens of ended streams", labels=keys)
    histograms = [
        (HistogramMetricFamily(f"{engine}_{name}", documentation, labels=keys), field)
        for name, field, documentation in ENGINE_HISTOGRAMS
    ]
    for (served, split), stats in sorted(list(telemetry.engines.items())):
        for (kind, outcome, code), count in sorted(list(stats.requests.items())):
            requests.add_metric((served, split, kind, outcome, code), count)
        prompt.add_metric((served, split), stats.prompt_tokens)
        completion.add_metric((served, split), stats.completion_tokens)
        for family, field in histograms:
            histogram: Histogram = getattr(stats, field)
            family.add_metric((served, split), _buckets(histogram), histogram.total)
    yield from (requests, prompt, completion, *(family for family, _field in histograms))


def _canaries(canaries: Canaries) -> Iterator[Metric]:
    """The canary families, one series set per split with an analysis."""
    canary = f"{PREFIX}_canary"
    weight = GaugeMetricFamily(
        f"{canary}_weight",
        "The candidate's weight now, percent of the two engines' traffic",
        labels=("split", "engine"),
    )
    step = GaugeMetricFamily(f"{canary}_step", "The canary's current step, from 1", labels=("split",))
    state = GaugeMetricFamily(f"{canary}_state", "1 for the canary's current state", labels=("split", "state"))
    decisions = CounterMetricFamily(
        f"{canary}_decisions", "Decisions of the canary and of its operators", labels=("split", "decision")
    )
    for split, run in sorted(list(canaries.running.items())):
        weight.add_metric((split, run.candidate), run.weight)
        step.add_metric((split,), run.step + 1)
        for name in STATES:
            state.add_metric((split, name), 1.0 if name == run.state else 0.0)
        for decision in DECISIONS:
            decisions.add_metric((split, decision), run.decisions[decision])
    yield from (weight, step, state, decisions)


def _mirrors(agreement: Agreement) -> Iterator[Metric]:
    """The mirror families, present (empty) before any copy so that a scraper can tell a gateway
    that mirrors nothing yet from one that cannot mirror."""
    pair = ("primary", "shadow")
    mirror = f"{PREFIX}_mirror"
    copies = CounterMetricFamily(f"{mirror}_copies", "Mirrored copies by outcome", labels=(*pair, "outcome"))
    errors = CounterMetricFamily(
        f"{mirror}_errors", "Compared streams ended by an engine error", labels=(*pair, "side", "code")
    )
    outputs = CounterMetricFamily(
        f"{mirror}_outputs", "Greedy outputs identical or diverged", labels=(*pair, "basis", "result")
    )
    divergence = HistogramMetricFamily(
        f"{mirror}_divergence_position",
        "First differing token (basis tokens) or character (basis text) of diverged greedy outputs",
        labels=(*pair, "basis"),
    )
    finishes = CounterMetricFamily(
        f"{mirror}_finish_reasons",
        "Outputs by the finish reason of each side",
        labels=(*pair, "primary_reason", "shadow_reason"),
    )
    ttft = HistogramMetricFamily(
        f"{mirror}_time_to_first_token_seconds", "Request start to first token, per side", labels=(*pair, "side")
    )
    itl = HistogramMetricFamily(
        f"{mirror}_inter_token_latency_seconds", "Gap between token events, per side", labels=(*pair, "side")
    )
    for (primary, shadow), stats in list(agreement.pairs.items()):
        for outcome, count in list(stats.copies.items()):
            copies.add_metric((primary, shadow, outcome), count)
        for (side, code), count in list(stats.errors.items()):
            errors.add_metric((primary, shadow, side, code), count)
        for basis in BASES:
            identical, diverged = stats.identical[basis], stats.diverged[basis]
            if identical or diverged:
                outputs.add_metric((primary, shadow, basis, "identical"), identical)
                outputs.add_metric((primary, shadow, basis, "diverged"), diverged)
                histogram = stats.divergence[basis]
                divergence.add_metric((primary, shadow, basis), _buckets(histogram), histogram.total)
        for (primary_reason, shadow_reason), count in list(stats.finish_reasons.items()):
            finishes.add_metric((primary, shadow, primary_reason, shadow_reason), count)
        for side in SIDES:
            ttft.add_metric((primary, shadow, side), _buckets(stats.ttft[side]), stats.ttft[side].total)
            itl.add_metric((primary, shadow, side), _buckets(stats.itl[side]), stats.itl[side].total)
    yield from (copies, errors, outputs, divergence, finishes, ttft, itl)


__all__ = ["PREFIX", "MetricsExporter", "MetricsServer"]
