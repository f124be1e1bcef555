"""The overhead benchmarks run end to end: every server starts, every measurement completes without errors.

Smoke tests of the programs ``make bench`` runs, at their smallest sizes; they check that the programs
work, never the figures (timing belongs in the benchmarks, not in the suite).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from benchmarks.processes import ROOT


def _run(module: str, *args: str, timeout_s: float) -> str:
    """``python -m module args`` from the repository root; its output, which it must exit 0 with."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert done.returncode == 0, f"{module} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _errors(report: str) -> list[int]:
    """The error counts of every throughput line (``..., N errors``)."""
    return [int(count) for count in re.findall(r"(\d+) errors", report)]


def test_gateway_ceiling_runs_every_measurement() -> None:
    report = _run("benchmarks.gateway_ceiling", "--rounds", "1", "--quick", timeout_s=200)
    for section in ("throughput", "server CPU per message", "time to first token", "concurrent streams", "memory"):
        assert f"-- {section}" in report or re.search(rf"-- \d+ {section}", report), section
    assert _errors(report) and not any(_errors(report)), report
    assert len(re.findall(r"complete, 0 errors.*PASS", report)) == 2, report  # the burst, on both servers
    assert re.search(r"gateway's extra over bare\s+-?\d+\.\d KiB/stream", report), report


def test_scale_runs_every_measurement() -> None:
    report = _run("benchmarks.scale", "--quick", timeout_s=200)
    runs = re.findall(r"^-- 256 streams x 128 tokens", report, re.MULTILINE)
    assert len(runs) == 3, report  # ramped and burst at full speed, ramped paced
    assert re.findall(r"streams completed\s+(\d+)/256, (\d+) errors", report) == [("256", "0")] * 3, report
    assert len(re.findall(r"tokens delivered\s+32,768/32,768", report)) == 3, report
    assert len(re.findall(r"streams started\s+\d+ held, -?\d+\.\d KiB/stream", report)) == 5, report  # and bare
    assert re.search(r"scale targets met\s+\d+ of \d+", report), report


@pytest.mark.vllm
def test_vllm_overhead_runs_every_peer() -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("smg_grpc_servicer")
    report = _run("benchmarks.vllm_overhead", "--quick", timeout_s=900)
    peers = ("gateway", "grpc python servicer", "grpc rust servicer", "openai server", "AsyncLLM in process")
    for concurrency in (1, 32):
        assert f"-- concurrency {concurrency}:" in report, report
    for peer in peers:  # both tables: every token delivered and checked, no errors
        assert len(re.findall(rf"^   {peer}\s+\d+ ok\s+0 ", report, re.MULTILINE)) == 2, (peer, report)
    for peer in peers[1:]:
        assert re.search(rf"throughput / {peer}\s+\d+\.\d{{3}}x", report), (peer, report)
    assert re.search(r"gateway frontend CPU per token\s+\d+\.\d us\s+(PASS|FAIL)", report), report
