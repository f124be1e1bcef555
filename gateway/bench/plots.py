"""The PNG report: latency CDFs per target and output throughput over time, drawn with matplotlib.

matplotlib is an optional extra (``pip install 'openengine-gateway[bench]'``), imported only
here and only when a report is asked for; figures are drawn on the Agg canvas directly, without
pyplot's global state, so no display is needed. Every figure carries the run's settings (date,
targets, load) under its plot, so a PNG read alone still says what it measured. Inter-token
latency is drawn on a log axis: its gaps span orders of magnitude (coalesced tokens, a long tail),
and on a linear axis nearly every sample sat in the first few percent of it. ``bench --live`` draws
the same CDFs from a gateway's histograms, whose points are the bucket bounds.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ReportError
from .records import TargetRun
from .stats import BucketCounts, Samples, throughput_over_time

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


def prepare_directory(directory: Path) -> None:
    """Make the report directory now, as the plots would: a path that cannot be one fails before a
    run, not after it. Raises ``ReportError`` saying why."""
    if directory.exists() and not directory.is_dir():
        raise ReportError("exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ReportError(f"cannot create the directory ({error.strerror or error})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ReportError("not a writable directory")


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


@dataclass(frozen=True)
class BucketPlot:
    """One CDF drawn from histograms: a curve per label, its x values the bucket bounds times ``scale``."""

    name: str
    title: str
    xlabel: str
    axis: str
    """The x axis' matplotlib scale: linear, log or symlog."""
    curves: Mapping[str, BucketCounts]
    scale: float = 1.0


def bucket_figures(plots: Sequence[BucketPlot], settings: str = "") -> dict[str, Figure]:
    """Each plot's figure by file name: the share of observations at or below each finite bucket bound."""
    drawn: dict[str, Figure] = {}
    for plot in plots:
        figure = drawn[plot.name] = _figure(plot.title, plot.xlabel, "fraction of observations", settings)
        axes = figure.axes[0]
        axes.set_xscale(plot.axis)
        for label, histogram in plot.curves.items():
            if histogram.count:
                finite = histogram.bounds[:-1]
                fractions = [count / histogram.count for count in histogram.cumulative[:-1]]
                axes.plot([bound * plot.scale for bound in finite], fractions, marker=".", label=label)
        if axes.has_data():
            axes.legend()
    return drawn


def write_bucket_plots(plots: Sequence[BucketPlot], directory: Path, settings: str = "") -> list[Path]:
    """Write ``bucket_figures(plots, settings)`` into ``directory``; the paths written."""
    require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    return [_save(figure, directory / name) for name, figure in bucket_figures(plots, settings).items()]


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=110)
    return path


__all__ = [
    "BucketPlot",
    "bucket_figures",
    "caption",
    "figures",
    "prepare_directory",
    "require_matplotlib",
    "write_bucket_plots",
    "write_plots",
]
