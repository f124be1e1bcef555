"""``openengine-gateway bench`` end to end against an in-process gateway serving two mock engines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway.bench import Lengths, ReportError, Workload, WorkloadSpec, require_matplotlib
from openengine_gateway.bench.cli import run
from openengine_gateway.cli import main
from openengine_gateway.testing import RunningGateway, serve_backends


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    """Two identical greedy mock engines, served as ``a`` and ``b``."""
    engines = [("a", MockBackend(MockSettings())), ("b", MockBackend(MockSettings()))]
    async with serve_backends(engines) as running:
        yield running


async def test_two_targets_same_workload_consistent_report(
    gateway: RunningGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = gateway.address
    argv = [
        *("--target", f"{address}/a", "--target", f"{address}/b"),
        *("--num-requests", "12", "--concurrency", "3", "--warmup", "1", "--seed", "7"),
        *("--prompt-len", "16:48", "--output-len", "4:12", "--prefix-groups", "2", "--prefix-len", "32"),
        *("--json", str(tmp_path / "bench.json"), "--report", str(tmp_path / "report"), "--no-progress"),
    ]
    assert await run(argv) == 0
    document = json.loads((tmp_path / "bench.json").read_text())
    spec = WorkloadSpec(
        seed=7, prompt_lengths=Lengths(16, 48), output_lengths=Lengths(4, 12), prefix_groups=2, prefix_length=32
    )
    workload = Workload(spec)
    expected = [workload.request(i) for i in range(12)]
    assert document["settings"]["targets"] == [f"{address}/a", f"{address}/b"]
    for target in document["targets"]:
        assert (target["requests"], target["completed"], target["failed"], target["errors"]) == (12, 12, 0, {})
        assert [r["index"] for r in target["per_request"]] == list(range(12))
        assert [r["output_tokens"] for r in target["per_request"]] == [r.max_tokens for r in expected]
        assert target["output_tokens"] == target["usage_completion_tokens"] == sum(r.max_tokens for r in expected)
        assert target["prompt_tokens"] == sum(len(r.prompt) + 1 for r in expected), "byte tokens and a BOS"
        assert target["ttft_s"]["count"] == target["e2e_s"]["count"] == target["tpot_s"]["count"] == 12
        assert target["itl_s"]["count"] == target["messages"] - 12
        assert target["tokens_per_message"]["mean"] * target["messages"] == pytest.approx(target["output_tokens"])
        assert target["requests_per_s"] == pytest.approx(12 / target["duration_s"])
        assert 0 < target["ttft_s"]["p50"] <= target["e2e_s"]["p99"]
    [agreement] = document["agreement"]
    assert (agreement["baseline"], agreement["target"], agreement["compared"]) == (f"{address}/a", f"{address}/b", 12)
    assert agreement["identical"] == agreement["common_prefix"] == 1.0
    for name in ("ttft_cdf", "itl_cdf", "tpot_cdf", "e2e_cdf", "throughput"):
        assert (tmp_path / "report" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert f"{address}/a" in table and "identical outputs" in table and "100.0%" in table
    assert "concurrency 3, 12 requests per target" in table


async def test_request_rate_sends_every_target_the_same_requests_and_counts_errors(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    address = gateway.address
    argv = [
        *("--target", f"{address}/a", "--target", f"{address}/missing"),
        *("--request-rate", "400", "--burstiness", "0.5", "--duration", "0.1", "--warmup", "0"),
        *("--prompt-len", "8", "--output-len", "2", "--temperature", "1", "--json", str(tmp_path / "b.json")),
        "--no-progress",
    ]
    assert await run(argv) == 1, "a target that finished no request"
    document = json.loads((tmp_path / "b.json").read_text())
    spec = WorkloadSpec(prompt_lengths=Lengths(8, 8), output_lengths=Lengths(2, 2), request_rate=400.0, burstiness=0.5)
    timed = Workload(spec)
    scheduled = next(i for i in range(10_000) if (timed.request(i).send_at or 0.0) >= 0.1)  # arrivals before 0.1 s
    served, missing = document["targets"]
    assert served["requests"] == missing["requests"] == scheduled
    assert served["completed"] == scheduled and served["output_tokens"] == 2 * scheduled
    assert missing["errors"] == {"NOT_FOUND": scheduled} and missing["ttft_s"]["count"] == 0
    assert document["agreement"] == [], "no agreement at temperature 1"


def test_the_gateway_command_dispatches_bench(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--help"])
    assert exited.value.code == 0 and "openengine-gateway bench" in capsys.readouterr().out
    assert main(["bench", "--target", "127.0.0.1:1/m", "--prompts-file", "/nonexistent.jsonl"]) == 2


def test_a_report_without_matplotlib_fails_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(ReportError, match=r"openengine-gateway\[bench\]"):
        require_matplotlib()
