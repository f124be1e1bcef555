"""The PNG report: latency CDFs per target and output throughput over time, drawn with matplotlib.

matplotlib is an optional extra (``pip install 'openengine-gateway[bench]'``), imported only
here and only when a report is asked for; figures are drawn on the Agg canvas directly, without
pyplot's global state, so no display is needed. Every figure carries the run's settings (date,
targets, load) under its plot, so a PNG read alone still says what it measured. Inter-token
latency is drawn on a log axis: its gaps span orders of magnitude (coalesced tokens, a long tail),
and on a linear axis nearly every sample sat in the first few percent of it.
"""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ReportError
from .records import TargetRun
from .stats import Samples, throughput_over_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_CDFS = (
    ("ttft", "Time to first token", "ttft_cdf.png", "linear"),
    ("itl", "Inter-token latency (gap between token messages)", "itl_cdf.png", "log"),
    ("tpot", "Time per output token", "tpot_cdf.png", "linear"),
    ("e2e", "End-to-end latency", "e2e_cdf.png", "linear"),
)
"""Each CDF: the ``Samples`` field, the title, the file, and the scale of its milliseconds axis."""


def require_matplotlib() -> None:
    """Raise ``ReportError`` unless matplotlib can be imported (checked before a run, not after it)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ReportError("--report needs matplotlib: pip install 'openengine-gateway[bench]'")


def caption(runs: Sequence[TargetRun], workload: str, started: datetime) -> str:
    """The run's settings in a few lines: when, against which targets, under which load."""
    targets = ", ".join(run.target.label for run in runs)
    line = f"{started:%Y-%m-%d %H:%M %Z} | targets: {targets} | {workload}"
    return textwrap.fill(line, width=120)


def _figure(title: str, xlabel: str, ylabel: str, settings: str) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if settings:
        figure.supxlabel(settings, fontsize=7, color="0.3")
    return figure


def figures(runs: Sequence[TargetRun], settings: str = "") -> dict[str, Figure]:
    """The CDFs and the throughput plot of ``runs`` by file name, each captioned with ``settings``."""
    samples = [Samples.of(run.records) for run in runs]
    drawn: dict[str, Figure] = {}
    for field, title, name, scale in _CDFS:
        unit = "milliseconds (log scale)" if scale == "log" else "milliseconds"
        figure = drawn[name] = _figure(title, unit, "fraction of samples", settings)
        axes = figure.axes[0]
        axes.set_xscale(scale)
        for run, sample in zip(runs, samples, strict=True):
            values = sorted(v * 1000.0 for v in getattr(sample, field))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                axes.step(values, fractions, where="post", label=run.target.label)
        if axes.has_data():
            axes.legend()
    figure = drawn["throughput.png"] = _figure(
        "Output throughput over time", "seconds since start", "output tokens/s", settings
    )
    axes = figure.axes[0]
    for run in runs:
        series = throughput_over_time([r for r in run.records if r.ok], run.duration_s)  # as the summary counts
        axes.plot([t for t, _ in series], [rate for _, rate in series], label=run.target.label)
    if axes.has_data():
        axes.legend()
    return drawn


def write_plots(runs: Sequence[TargetRun], directory: Path, settings: str = "") -> list[Path]:
    """Write ``figures(runs, settings)`` into ``directory``; the paths written."""
    require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    return [_save(figure, directory / name) for name, figure in figures(runs, settings).items()]


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=110)
    return path


__all__ = ["caption", "figures", "require_matplotlib", "write_plots"]
