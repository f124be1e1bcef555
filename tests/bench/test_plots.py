"""``bench.plots``: inter-token latency on a log axis, the run's settings on every figure, and a
``--report`` path that cannot hold the plots refused before the run."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from openengine_gateway.bench import RequestRecord, Target, TargetRun
from openengine_gateway.bench.plots import caption, figures, write_plots
from openengine_gateway.cli import main

pytest.importorskip("matplotlib")

STARTED = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)


def _runs() -> list[TargetRun]:
    gaps = [0.1, 0.1005, 0.101, 0.102, 0.4]  # most gaps tiny, one long: what a linear axis squashed
    record = RequestRecord(0, 0.0, 0.5, gaps, [1, 1, 1, 1, 1], [4, 5, 6, 7, 8], prompt_tokens=9, completion_tokens=5)
    return [TargetRun(Target("h:1", "a"), "mock 1", 1.0, [record]), TargetRun(Target("h:2"), "mock 1", 1.0, [record])]


def test_the_caption_says_when_against_what_and_under_which_load() -> None:
    text = caption(_runs(), "concurrency 4, 100 requests per target", STARTED)
    assert text == "2026-12-05 09:30 UTC | targets: h:1/a, h:2 | concurrency 4, 100 requests per target"


def test_inter_token_latency_is_on_a_log_axis_and_every_figure_carries_the_settings() -> None:
    drawn = figures(_runs(), "SETTINGS")
    assert list(drawn) == ["ttft_cdf.png", "itl_cdf.png", "tpot_cdf.png", "e2e_cdf.png", "throughput.png"]
    assert {name: figure.axes[0].get_xscale() for name, figure in drawn.items()}["itl_cdf.png"] == "log"
    assert drawn["ttft_cdf.png"].axes[0].get_xscale() == "linear"
    assert "log scale" in drawn["itl_cdf.png"].axes[0].get_xlabel()
    assert {figure.get_supxlabel() for figure in drawn.values()} == {"SETTINGS"}


def test_write_plots_writes_every_figure(tmp_path: Path) -> None:
    written = write_plots(_runs(), tmp_path / "report", "SETTINGS")
    assert [path.name for path in written] == list(figures(_runs()))
    assert all(path.stat().st_size > 0 for path in written)


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_report_path_that_cannot_be_a_directory_fails_before_the_run(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    report = blocker if where == "a file" else blocker / "report"
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--target", "127.0.0.1:1/m", "--report", str(report)])  # nothing listens there
    assert exited.value.code == 2 and f"--report {report}:" in capsys.readouterr().err


def test_a_report_directory_is_made_before_the_run(tmp_path: Path) -> None:
    report = tmp_path / "new" / "report"
    assert main(["bench", "--target", "127.0.0.1:1/m", "--report", str(report), "--no-progress"]) == 2
    assert report.is_dir()  # made before the unreachable target ended the run
