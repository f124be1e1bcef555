"""The mirror families of the metrics exporter: each sample as the gateway's ``Agreement`` counted it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openengine_gateway.core.agreement import Agreement, Side
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.testing import RunningGateway
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ops.support import gateway

M = "openengine_gateway_mirror"


@pytest.fixture
async def running() -> AsyncIterator[RunningGateway]:
    async with gateway(server=ServerOptions(metrics_port=0)) as served:
        yield served


def samples(running: RunningGateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exporter's page, parsed as a scraper would, by (sample name, sorted labels)."""
    exporter = running.server.metrics
    assert exporter is not None
    text = generate_latest(exporter.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(M)
    }


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"primary": "a", "shadow": "b", **pairs}.items()))


def side(engine: str, tokens: list[int], reason: str, ttft_s: float, error: str = "") -> Side:
    return Side(engine, [tokens], [str(tokens)], [reason], ttft_s, [0.004, 0.03], error)


async def test_the_families_are_there_before_any_copy(running: RunningGateway) -> None:
    exporter = running.server.metrics
    assert exporter is not None
    names = {family.name for family in text_string_to_metric_families(generate_latest(exporter.registry).decode())}
    assert {f"{M}_copies", f"{M}_outputs", f"{M}_time_to_first_token_seconds"} <= names
    assert samples(running) == {}


async def test_every_mirror_sample_follows_the_agreement(running: RunningGateway) -> None:
    agreement: Agreement = running.gateway.agreement
    agreement.compared(
        side("a", [1, 2, 3], "STOP", 0.02), side("b", [1, 2, 3], "STOP", 0.2), greedy=True, same_tokenizer=True
    )
    agreement.compared(
        side("a", [1, 2, 3], "STOP", 0.02), side("b", [1, 5], "LENGTH", 0.2), greedy=True, same_tokenizer=True
    )
    agreement.compared(
        side("a", [1], "STOP", 0.02),
        side("b", [], "", 0.2, error="ENGINE_OVERLOADED"),
        greedy=False,
        same_tokenizer=True,
    )
    agreement.shed("a", "b")
    agreement.skipped("a", "b")
    agreement.skipped("a", "b")
    agreement.cancelled("a", "b")
    page = samples(running)

    for outcome, count in (("compared", 3), ("shed", 1), ("skipped", 2), ("cancelled", 1)):
        assert page[f"{M}_copies_total", labels(outcome=outcome)] == count
    assert page[f"{M}_errors_total", labels(side="shadow", code="ENGINE_OVERLOADED")] == 1
    assert page[f"{M}_outputs_total", labels(basis="tokens", result="identical")] == 1
    assert page[f"{M}_outputs_total", labels(basis="tokens", result="diverged")] == 1
    assert not any(key[1] == labels(basis="text", result="identical") for key in page)  # no text comparison made
    assert page[f"{M}_divergence_position_bucket", labels(basis="tokens", le="0.0")] == 0
    assert page[f"{M}_divergence_position_bucket", labels(basis="tokens", le="1.0")] == 1
    assert page[f"{M}_divergence_position_count", labels(basis="tokens")] == 1
    assert page[f"{M}_divergence_position_sum", labels(basis="tokens")] == 1
    assert page[f"{M}_finish_reasons_total", labels(primary_reason="STOP", shadow_reason="STOP")] == 1
    assert page[f"{M}_finish_reasons_total", labels(primary_reason="STOP", shadow_reason="LENGTH")] == 1
    assert page[f"{M}_finish_reasons_total", labels(primary_reason="STOP", shadow_reason="UNFINISHED")] == 1
    for which, ttft_s in (("primary", 0.02), ("shadow", 0.2)):
        assert page[f"{M}_time_to_first_token_seconds_count", labels(side=which)] == 3
        assert page[f"{M}_time_to_first_token_seconds_sum", labels(side=which)] == pytest.approx(3 * ttft_s)
        assert page[f"{M}_time_to_first_token_seconds_bucket", labels(side=which, le="0.25")] == 3
        assert page[f"{M}_time_to_first_token_seconds_bucket", labels(side=which, le="0.01")] == 0
        assert page[f"{M}_inter_token_latency_seconds_count", labels(side=which)] == 6
        assert page[f"{M}_inter_token_latency_seconds_bucket", labels(side=which, le="0.005")] == 3
        assert page[f"{M}_inter_token_latency_seconds_bucket", labels(side=which, le="+Inf")] == 6
