"""``openengine-gateway bench`` end to end against an in-process gateway serving two mock engines."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.bench import Lengths, ReportError, Workload, WorkloadSpec, require_matplotlib
from openengine_gateway.bench.cli import run
from openengine_gateway.bench.errors import BenchError
from openengine_gateway.bench.progress import Progress
from openengine_gateway.bench.prompts import load_prompts
from openengine_gateway.bench.records import RequestRecord, Target, distinct
from openengine_gateway.bench.runner import RunOptions, _Sender, benchmark
from openengine_gateway.bench.workload import BenchRequest
from openengine_gateway.cli import main
from openengine_gateway.client import ClientError
from openengine_gateway.testing import RunningGateway, serve_backends


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    """Two identical greedy mock engines, served as ``a`` and ``b``; ``short`` refuses outputs past 1 token."""
    engines = [
        ("a", MockBackend(MockSettings())),
        ("b", MockBackend(MockSettings())),
        ("short", MockBackend(MockSettings(max_output_tokens=1))),
    ]
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
        assert {r["scheduled_s"] for r in target["per_request"]} == {None}, "a fixed concurrency schedules nothing"
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


async def test_the_later_layout_measures_the_same_outputs(gateway: RunningGateway, tmp_path: Path) -> None:
    """``--layout later`` sends the workload through upstream's later services: the same greedy outputs."""
    outputs = {}
    for layout in ("seed", "later"):
        argv = [
            *("--target", f"{gateway.address}/a", "--layout", layout, "--num-requests", "3", "--seed", "3"),
            *("--prompt-len", "8", "--output-len", "2:5", "--json", str(tmp_path / f"{layout}.json"), "--no-progress"),
        ]
        assert await run(argv) == 0
        document = json.loads((tmp_path / f"{layout}.json").read_text())
        [target] = document["targets"]
        assert (document["settings"]["layout"], target["completed"], target["errors"]) == (layout, 3, {})
        outputs[layout] = [r["output_tokens"] for r in target["per_request"]], target["usage_completion_tokens"]
    assert outputs["later"] == outputs["seed"]


async def test_request_rate_sends_every_target_the_same_requests_and_counts_errors(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    address = gateway.address
    argv = [
        *("--target", f"{address}/a", "--target", f"{address}/short"),
        *("--request-rate", "400", "--burstiness", "0.5", "--duration", "0.1", "--warmup", "0"),
        *("--prompt-len", "8", "--output-len", "2", "--temperature", "1", "--json", str(tmp_path / "b.json")),
        "--no-progress",
    ]
    assert await run(argv) == 1, "a target that finished no request"
    document = json.loads((tmp_path / "b.json").read_text())
    spec = WorkloadSpec(prompt_lengths=Lengths(8, 8), output_lengths=Lengths(2, 2), request_rate=400.0, burstiness=0.5)
    timed = Workload(spec)
    scheduled = next(i for i in range(10_000) if (timed.request(i).send_at or 0.0) >= 0.1)  # arrivals before 0.1 s
    served, refused = document["targets"]
    assert served["requests"] == refused["requests"] == scheduled
    assert served["completed"] == scheduled and served["output_tokens"] == 2 * scheduled
    assert refused["errors"] == {"INVALID_ARGUMENT": scheduled} and refused["ttft_s"]["count"] == 0
    assert "max_tokens" in refused["error_examples"]["INVALID_ARGUMENT"]  # what the server said, to read
    assert refused["per_request"][0]["error_message"] == refused["error_examples"]["INVALID_ARGUMENT"]
    for target in document["targets"]:  # each request's arrival time, and when it was sent (not before)
        arrivals = [r["scheduled_s"] for r in target["per_request"]]
        assert arrivals == [round(timed.request(i).send_at or 0.0, 6) for i in range(scheduled)]
        assert all(r["started_s"] >= r["scheduled_s"] - 1e-6 for r in target["per_request"])
    assert document["agreement"] == [], "no agreement at temperature 1"


async def test_a_model_no_target_serves_is_found_before_anything_is_measured(
    gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", f"{gateway.address}/a", "--target", f"{gateway.address}/typo", "--no-progress"]
    with pytest.raises(BenchError, match=r"serves no model 'typo' \(it serves \['a', 'b', 'short'\]\)"):
        await run(argv)
    with pytest.raises(BenchError, match="name one as HOST:PORT/MODEL"):
        await run(["--target", gateway.address, "--no-progress"])
    assert capsys.readouterr().out == ""  # nothing was measured


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--request-rate", "nan", "--duration", "2"), "a request rate is a positive number"),
        (("--duration", "inf"), "a time is a positive number of seconds"),
        (("--duration", "nan"), "a time is a positive number of seconds"),
        (("--temperature", "-1"), "a temperature is a number >= 0"),
        (("--timeout", "0"), "a time is a positive number of seconds"),
        (("--output-len", "5:3"), "needs 0 <= low <= high"),
        (("--json", "/nonexistent/dir/x.json"), "not a file in a writable directory"),
    ],
)
def test_unusable_settings_are_usage_errors_before_the_run(
    flags: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--target", "127.0.0.1:1/m", *flags])
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_a_target_without_a_port_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="HOST:PORT/MODEL"):
        Target.parse("localhost/x")
    assert Target.parse("[::1]:50051/m").address == "[::1]:50051"


def test_the_gateway_command_dispatches_bench(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--help"])
    assert exited.value.code == 0 and "openengine-gateway bench" in capsys.readouterr().out
    assert main(["bench", "--target", "127.0.0.1:1/m", "--prompts-file", "/nonexistent.jsonl"]) == 2


def test_burstiness_without_a_request_rate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--target", "127.0.0.1:1/m", "--burstiness", "0.5"])
    assert exited.value.code == 2 and "--burstiness shapes the arrivals of --request-rate" in capsys.readouterr().err


def test_a_report_without_matplotlib_fails_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(ReportError, match=r"openengine-gateway\[bench\]"):
        require_matplotlib()


async def test_an_infinite_rate_for_a_duration_stops_at_the_deadline(gateway: RunningGateway, tmp_path: Path) -> None:
    """Every arrival is at 0 at an infinite rate: the clock, not the arrival, ends the sending."""
    argv = [
        *("--target", f"{gateway.address}/a", "--request-rate", "inf", "--concurrency", "2", "--duration", "0.2"),
        *("--prompt-len", "8", "--output-len", "2", "--warmup", "0", "--json", str(tmp_path / "inf.json")),
        "--no-progress",
    ]
    assert await asyncio.wait_for(run(argv), 30) == 0
    (target,) = json.loads((tmp_path / "inf.json").read_text())["targets"]
    assert target["requests"] == target["completed"] > 0 and target["duration_s"] < 5


@pytest.mark.parametrize(
    "extra",
    [
        ("--request-rate", "inf", "--duration", "1"),
        ("--warmup", "-1"),
        ("--duration", "-1"),
        ("--num-requests", "0"),
        ("--timeout", "0"),
        ("--prompt-len", "0"),
    ],
)
def test_unbounded_or_negative_loads_are_usage_errors(extra: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as exited:
        asyncio.run(run(["--target", "127.0.0.1:1/m", *extra]))
    assert exited.value.code == 2


async def test_a_cancelled_or_unfinished_stream_is_a_failed_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Completed means every output finished: an engine's cancellation, or a stream cut short, is a failure."""
    endings = {
        0: [pb.GenerateResponse(token=pb.TokenOutput(output_index=0, tokens=[pb.TokenInfo(token_id=5)]))],
        1: [pb.GenerateResponse(finished=pb.GenerationFinished(output_index=0, reason=pb.FINISH_REASON_CANCELLED))],
        2: [pb.GenerateResponse(error=pb.EngineError(code=999))],  # a code this client does not know
        3: [pb.GenerateResponse(finished=pb.GenerationFinished(output_index=0, reason=pb.FINISH_REASON_LENGTH))],
    }
    for responses in endings.values():
        responses[-1].usage.completion_tokens = 1

    class Client:
        def __init__(self) -> None:
            self.sent = 0

        async def stream(self, _message: object, timeout_s: float | None = None) -> AsyncIterator[pb.GenerateResponse]:
            index, self.sent = self.sent, self.sent + 1
            for response in endings[index]:
                yield response

    endings[0][0].ClearField("usage")  # the first stream just stops, its finish never sent
    client = Client()
    records = [await _Sender(client, Target("t"), RunOptions(), None)(request) for request in _requests(4)]  # type: ignore[arg-type]
    assert [r.error for r in records] == ["INCOMPLETE_STREAM", "FINISH_REASON_CANCELLED", "ERROR_CODE_999", None]


def _requests(count: int) -> list[BenchRequest]:
    return [BenchRequest(i, "x", 1) for i in range(count)]


async def test_warm_up_never_sends_the_prompts_files_prompts(tmp_path: Path) -> None:
    """Those are the measured prompts: warming them would fill the prefix cache for the run."""
    prompts = tmp_path / "p.json"  # JSON lines in a .json file are JSON lines too
    prompts.write_text('{"prompt": "alpha beta gamma", "output_len": 3}\n{"prompt": "delta epsilon"}\n')
    spec = WorkloadSpec(prompts=load_prompts(prompts))
    warm = Workload(spec).warmup(4)
    assert {r.prompt for r in warm}.isdisjoint({"alpha beta gamma", "delta epsilon"})
    assert sorted({(len(r.prompt), r.max_tokens) for r in warm}) == [(13, 64), (16, 3)]


async def test_every_target_is_reached_before_any_is_measured(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable second target ends the run before the first has been measured for nothing."""
    sent: list[BenchRequest] = []

    async def send(_self: _Sender, request: BenchRequest) -> None:
        sent.append(request)

    monkeypatch.setattr(_Sender, "__call__", send)
    targets = [Target(gateway.address, "a"), Target("127.0.0.1:1", "m")]
    with pytest.raises(ClientError):
        await benchmark(targets, Workload(WorkloadSpec()), RunOptions(num_requests=2))
    assert sent == []


def test_a_target_given_twice_gets_a_label_of_its_own() -> None:
    same = Target.parse("h:1/m")
    labels = [t.label for t in distinct([same, Target.parse("h:1"), same, same])]
    assert labels == ["h:1/m", "h:1", "h:1/m #2", "h:1/m #3"]


def test_progress_counts_time_on_the_measured_clock() -> None:
    """Warm-up is not part of the elapsed time shown: records carry the measured phase's clock."""
    out = io.StringIO()
    line = Progress("t", 2, stream=out)
    line.update(RequestRecord(0, started=0.0, ended=1.25))
    line.update(RequestRecord(1, started=0.5, ended=2.5, error="UNAVAILABLE"))
    assert out.getvalue().endswith(f"\rt: |{'#' * 30}| 100% 2/2 requests, 1 failed [2.5s]")


def test_progress_bar_fills_with_the_bound_that_ends_the_run_first() -> None:
    """A run bounded by requests and a duration ends at whichever comes first: the bar shows that one."""
    out = io.StringIO()
    line = Progress("t", 100, duration_s=10.0, stream=out)
    line.update(RequestRecord(0, started=0.0, ended=5.0))
    assert line.fraction == 0.5
    assert out.getvalue().endswith(f"\rt: |{'#' * 15}{'.' * 15}|  50% 1/100 requests [5.0/10s]")
    assert Progress("t", None).fraction is None  # nothing bounds it: no bar


async def test_a_rate_sends_every_scheduled_request_to_a_target_that_falls_behind() -> None:
    """The duration bounds the schedule: a slow target behind a cap is sent the same requests, late."""
    from openengine_gateway.bench import runner

    class SlowSender:
        def __init__(self) -> None:
            self.zero = asyncio.get_running_loop().time()
            self.records: list[RequestRecord] = []

        def clock(self) -> float:
            return asyncio.get_running_loop().time() - self.zero

        async def __call__(self, request: BenchRequest) -> RequestRecord:
            await asyncio.sleep(0.03)  # a third of the schedule's pace
            self.records.append(record := RequestRecord(request.index, self.clock()))
            return record

    workload = Workload(WorkloadSpec(prompt_lengths=Lengths(8, 8), output_lengths=Lengths(2, 2), request_rate=100.0))
    scheduled = next(i for i in range(10_000) if (workload.request(i).send_at or 0.0) >= 0.2)
    sender = SlowSender()
    await runner._request_rate(sender, workload, 1, None, 0.2)  # type: ignore[arg-type]
    assert sorted(record.index for record in sender.records) == list(range(scheduled))


async def test_ctrl_c_reports_what_was_measured_and_skips_the_targets_left(
    gateway: RunningGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first SIGINT ends the run without losing it: the target being measured keeps the requests that
    had ended (marked interrupted), later targets are not run, and the exit status is 130."""
    update = Progress.update

    def interrupt_after_five(self: Progress, record: RequestRecord) -> None:
        update(self, record)
        if self.done == 5:
            os.kill(os.getpid(), signal.SIGINT)  # the run's own handler takes it: no KeyboardInterrupt

    monkeypatch.setattr(Progress, "update", interrupt_after_five)
    address = gateway.address
    argv = [
        *("--target", f"{address}/a", "--target", f"{address}/b", "--num-requests", "100000"),
        *("--concurrency", "4", "--output-len", "64", "--json", str(tmp_path / "bench.json"), "--no-progress"),
    ]
    assert await run(argv) == 130
    [measured] = json.loads((tmp_path / "bench.json").read_text())["targets"]
    assert measured["target"] == f"{address}/a" and measured["interrupted"] is True
    assert 5 <= measured["completed"] < 100 and measured["failed"] == 0, "in-flight requests are dropped, not failed"
    out, err = capsys.readouterr()
    assert f"{address}/a: interrupted after" in out
    assert f"interrupted; not measured: {address}/b" in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Python's own handler is back"


async def test_a_run_stopped_before_it_starts_measures_nothing(gateway: RunningGateway) -> None:
    stop = asyncio.Event()
    stop.set()
    options = RunOptions(num_requests=10, warmup=2)
    workload = Workload(WorkloadSpec(prompt_lengths=Lengths(8, 8), output_lengths=Lengths(2, 2)))
    assert await benchmark([Target.parse(f"{gateway.address}/a")], workload, options, stop=stop) == []
