"""Benchmark OpenEngine endpoints: one seeded workload replayed against each target, compared.

From the command line: ``openengine-gateway bench --target host:port/model --target ...``. From
Python, the same pieces::

    from openengine_gateway.bench import RunOptions, Target, Workload, WorkloadSpec, benchmark, compare, to_text

    runs = await benchmark([Target("127.0.0.1:50051", "a"), Target("127.0.0.1:50052", "b")],
                           Workload(WorkloadSpec(seed=1)), RunOptions(concurrency=8, num_requests=200))
    print(to_text(compare(runs, greedy=True)))

The workload, records, statistics and report modules import no grpc; ``runner`` is the only part
that talks to a server, and ``plots`` the only one that imports matplotlib (lazily).
"""

from .arrivals import arrival_offsets
from .errors import BenchError, ReportError, WorkloadError
from .plots import require_matplotlib, write_plots
from .prompts import PromptEntry, load_prompts, synthetic_text
from .records import RequestRecord, Target, TargetRun
from .report import to_json, to_text
from .runner import Connection, OnDone, RunOptions, benchmark, run_target
from .stats import (
    PERCENTILES,
    Agreement,
    BucketCounts,
    Comparison,
    Distribution,
    Samples,
    TargetSummary,
    agreement,
    common_prefix_fraction,
    compare,
    e2e,
    inter_token_gaps,
    summarize,
    throughput_over_time,
    tpot,
    ttft,
)
from .workload import BenchRequest, Lengths, Prompt, Workload, WorkloadSpec

__all__ = [
    "PERCENTILES",
    "Agreement",
    "BenchError",
    "BenchRequest",
    "BucketCounts",
    "Comparison",
    "Connection",
    "Distribution",
    "Lengths",
    "OnDone",
    "Prompt",
    "PromptEntry",
    "ReportError",
    "RequestRecord",
    "RunOptions",
    "Samples",
    "Target",
    "TargetRun",
    "TargetSummary",
    "Workload",
    "WorkloadError",
    "WorkloadSpec",
    "agreement",
    "arrival_offsets",
    "benchmark",
    "common_prefix_fraction",
    "compare",
    "e2e",
    "inter_token_gaps",
    "load_prompts",
    "require_matplotlib",
    "run_target",
    "summarize",
    "synthetic_text",
    "throughput_over_time",
    "to_json",
    "to_text",
    "tpot",
    "ttft",
    "write_plots",
]
