"""Benchmark results as a side-by-side terminal table and as JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .records import RequestRecord, TargetRun
from .stats import Comparison, Distribution, TargetSummary, e2e, ttft

Cell = Callable[[TargetSummary], str]
"""One target's entry in a row of the table."""

_LATENCIES = (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))


def number(value: float | None, digits: int = 1) -> str:
    """A figure with ``digits`` decimals, or "-" when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def _rows(comparison: Comparison) -> list[tuple[str, Cell]]:
    rows: list[tuple[str, Cell]] = [
        ("engine", lambda s: s.engine),
        ("requests ok / failed", lambda s: f"{s.completed} / {s.failed}"),
        ("duration (s)", lambda s: number(s.duration_s, 2)),
        ("requests/s", lambda s: number(s.requests_per_s, 2)),
        ("output tokens/s", lambda s: number(s.output_tokens_per_s)),
        ("output tokens (usage)", lambda s: f"{s.output_tokens} ({s.usage_completion_tokens})"),
        ("prompt tokens (cached)", lambda s: f"{s.prompt_tokens} ({number(s.cached_prompt_tokens, 0)})"),
        ("tokens/message mean", lambda s: number(s.tokens_per_message.mean, 2)),
    ]
    for label, name in _LATENCIES:
        rows.append((f"{label} (ms) mean", _latency(name, "mean")))
        rows.extend((f"{'':>{len(label) + 5}} {stat}", _latency(name, stat)) for stat in ("p50", "p90", "p99"))
    codes = sorted({code for s in comparison.summaries for code in s.errors})
    rows.extend((f"error {code}", _errors(code)) for code in codes)
    if comparison.agreements:
        rows.append(("identical outputs", _agreement(comparison, "identical")))
        rows.append(("common prefix", _agreement(comparison, "common_prefix")))
    return rows


def _latency(name: str, stat: str) -> Cell:
    def cell(summary: TargetSummary) -> str:
        distribution: Distribution = getattr(summary, name)
        value: float | None = getattr(distribution, stat)
        return number(None if value is None else value * 1000.0, 2)

    return cell


def _errors(code: str) -> Cell:
    return lambda summary: str(summary.errors.get(code, 0))


def _agreement(comparison: Comparison, field: str) -> Cell:
    by_target = {a.target: a for a in comparison.agreements}

    def cell(summary: TargetSummary) -> str:
        agreement = by_target.get(summary.target)
        if agreement is None:
            return "baseline"
        value: float | None = getattr(agreement, field)
        return "-" if value is None else f"{value * 100:.1f}% of {agreement.compared}"

    return cell


def table(headers: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The lines of a table: a column per header, each row its name then one cell per column."""
    first = max(len(name) for name, _ in rows)
    widths = [max(len(header), *(len(cells[i]) for _, cells in rows)) for i, header in enumerate(headers)]
    lines = ["  ".join([" " * first, *(h.rjust(w) for h, w in zip(headers, widths, strict=True))])]
    for name, cells in rows:
        lines.append("  ".join([name.ljust(first), *(c.rjust(w) for c, w in zip(cells, widths, strict=True))]))
    return lines


def to_text(comparison: Comparison) -> str:
    """One column per target, one row per figure; agreement rows compare with the first target."""
    rows = [(name, [cell(s) for s in comparison.summaries]) for name, cell in _rows(comparison)]
    lines = table([s.target for s in comparison.summaries], rows)
    for summary in comparison.summaries:
        lines.extend(
            f"{summary.target}: first {code}: {message}" for code, message in summary.error_examples.items() if message
        )
        if summary.interrupted:
            lines.append(
                f"{summary.target}: interrupted after {summary.duration_s:.1f}s; "
                "the requests in flight then are not counted"
            )
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """``value`` with infinite or NaN floats as strings, which JSON cannot hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _request(record: RequestRecord) -> dict[str, Any]:
    return {
        "index": record.index,
        "scheduled_s": None if record.scheduled is None else round(record.scheduled, 6),
        "started_s": round(record.started, 6),
        "ttft_s": None if (first := ttft(record)) is None else round(first, 6),
        "e2e_s": round(e2e(record), 6),
        "output_tokens": record.output_tokens,
        "completion_tokens": record.completion_tokens,
        "messages": len(record.message_times),
        "error": record.error,
        "error_message": record.error_message,
    }


def to_json(comparison: Comparison, runs: Sequence[TargetRun], settings: Mapping[str, Any]) -> str:
    """Settings, each target's summary with its per-request figures, and the agreements."""
    targets = [
        {**dataclasses.asdict(summary), "per_request": [_request(r) for r in run.records]}
        for summary, run in zip(comparison.summaries, runs, strict=True)
    ]
    document = {
        "settings": dict(settings),
        "targets": targets,
        "agreement": [dataclasses.asdict(a) for a in comparison.agreements],
    }
    return json.dumps(_finite(document), indent=2)


__all__ = ["number", "table", "to_json", "to_text"]
