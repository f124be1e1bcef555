"""The PNG report: latency CDFs per target and output throughput over time, drawn with matplotlib.

matplotlib is an optional extra (``pip install 'openengine-gateway[bench]'``), imported only
here and only when a report is asked for; figures are drawn on the Agg canvas directly, without
pyplot's global state, so no display is needed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ReportError
from .records import TargetRun
from .stats import Samples, throughput_over_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_CDFS = (
    ("ttft", "Time to first token", "ttft_cdf.png"),
    ("itl", "Inter-token latency (gap between token messages)", "itl_cdf.png"),
    ("tpot", "Time per output token", "tpot_cdf.png"),
    ("e2e", "End-to-end latency", "e2e_cdf.png"),
)


def require_matplotlib() -> None:
    """Raise ``ReportError`` unless matplotlib can be imported (checked before a run, not after it)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ReportError("--report needs matplotlib: pip install 'openengine-gateway[bench]'")


def _figure(title: str, xlabel: str, ylabel: str) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure


def write_plots(runs: Sequence[TargetRun], directory: Path) -> list[Path]:
    """Write the CDFs and the throughput plot of ``runs`` into ``directory``; the paths written."""
    require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    samples = [Samples.of(run.records) for run in runs]
    written: list[Path] = []
    for field, title, name in _CDFS:
        figure = _figure(title, "milliseconds", "fraction of samples")
        axes = figure.axes[0]
        for run, sample in zip(runs, samples, strict=True):
            values = sorted(v * 1000.0 for v in getattr(sample, field))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                axes.step(values, fractions, where="post", label=run.target.label)
        if axes.has_data():
            axes.legend()
        written.append(_save(figure, directory / name))
    figure = _figure("Output throughput over time", "seconds since start", "output tokens/s")
    axes = figure.axes[0]
    for run in runs:
        series = throughput_over_time([r for r in run.records if r.ok], run.duration_s)  # as the summary counts
        axes.plot([t for t, _ in series], [rate for _, rate in series], label=run.target.label)
    if axes.has_data():
        axes.legend()
    written.append(_save(figure, directory / "throughput.png"))
    return written


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=110)
    return path


__all__ = ["require_matplotlib", "write_plots"]
