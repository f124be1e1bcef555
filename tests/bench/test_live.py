"""``openengine-gateway bench --live``: canned metrics pages served over HTTP, each figure hand-computed,
and one real gateway's exporter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from openengine_gateway.bench.cli import run
from openengine_gateway.bench.errors import BenchError
from openengine_gateway.bench.stats import BucketCounts
from openengine_gateway.cli import main
from openengine_gateway.client import EngineErrorEvent, OpenEngineClient, text_request
from openengine_gateway.config import SplitSection
from openengine_gateway.core.agreement import Side
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.tls import TlsFiles
from openengine_gateway.testing import serve_backends

from tests.ops.certs import issue_certificates
from tests.ops.support import free_port, gateway, mock

M = "openengine_gateway_mirror"


def page(compared: int = 10, ttft_fast: int = 5) -> str:
    """A gateway's mirror families for the pair a -> b (``ttft_fast`` of the 10 primary TTFTs under 0.1 s)."""
    pair = 'primary="a",shadow="b"'
    lines = [
        f"# TYPE {M}_copies_total counter",
        f'{M}_copies_total{{{pair},outcome="compared"}} {compared}',
        f'{M}_copies_total{{{pair},outcome="shed"}} 2',
        f'{M}_copies_total{{{pair},outcome="skipped"}} 4',
        f'{M}_copies_total{{{pair},outcome="cancelled"}} 1',
        f"# TYPE {M}_errors_total counter",
        f'{M}_errors_total{{{pair},side="shadow",code="ENGINE_OVERLOADED"}} 1',
        f"# TYPE {M}_outputs_total counter",
        f'{M}_outputs_total{{{pair},basis="tokens",result="identical"}} 6',
        f'{M}_outputs_total{{{pair},basis="tokens",result="diverged"}} 3',
        f"# TYPE {M}_divergence_position histogram",
        *(
            f'{M}_divergence_position_bucket{{{pair},basis="tokens",le="{le}"}} {count}'
            for le, count in (("0.0", 0), ("1.0", 0), ("2.0", 1), ("4.0", 2), ("8.0", 3), ("+Inf", 3))
        ),
        f'{M}_divergence_position_sum{{{pair},basis="tokens"}} 12.0',
        f'{M}_divergence_position_count{{{pair},basis="tokens"}} 3',
        f"# TYPE {M}_finish_reasons_total counter",
        *(
            f'{M}_finish_reasons_total{{{pair},primary_reason="{ours}",shadow_reason="{theirs}"}} {count}'
            for ours, theirs, count in (
                ("STOP", "STOP", 7),
                ("STOP", "LENGTH", 1),
                ("LENGTH", "LENGTH", 1),
                ("STOP", "UNFINISHED", 1),
                ("UNFINISHED", "UNFINISHED", 4),
            )
        ),
        f"# TYPE {M}_time_to_first_token_seconds histogram",
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="primary",le="0.1"}} {ttft_fast}',
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="primary",le="0.2"}} 10',
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="primary",le="+Inf"}} 10',
        f'{M}_time_to_first_token_seconds_sum{{{pair},side="primary"}} 1.0',
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="shadow",le="0.1"}} 0',
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="shadow",le="0.2"}} 0',
        f'{M}_time_to_first_token_seconds_bucket{{{pair},side="shadow",le="+Inf"}} 10',
        f'{M}_time_to_first_token_seconds_sum{{{pair},side="shadow"}} 5.0',
        f"# TYPE {M}_inter_token_latency_seconds histogram",
        f'{M}_inter_token_latency_seconds_bucket{{{pair},side="primary",le="0.01"}} 10',
        f'{M}_inter_token_latency_seconds_bucket{{{pair},side="primary",le="0.02"}} 20',
        f'{M}_inter_token_latency_seconds_bucket{{{pair},side="primary",le="+Inf"}} 20',
        f'{M}_inter_token_latency_seconds_sum{{{pair},side="primary"}} 0.25',
    ]
    return "\n".join(lines) + "\n"


EMPTY = f"# HELP {M}_copies_total Mirrored copies by outcome\n# TYPE {M}_copies_total counter\n"


class Pages:
    """A local HTTP server answering each GET with the next of its pages (the last one again once they run out)."""

    def __init__(self, *pages: str, status: int = 200) -> None:
        self.pages = list(pages)
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (served.pages.pop(0) if len(served.pages) > 1 else served.pages[0]).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve() -> Iterator[type[Pages]]:
    started: list[Pages] = []

    class Tracked(Pages):
        def __init__(self, *pages: str, status: int = 200) -> None:
            super().__init__(*pages, status=status)
            started.append(self)

    yield Tracked
    for server in started:
        server.close()


def row(output: str, name: str) -> list[str]:
    """The cells of the table row called ``name``."""
    for line in output.splitlines():
        if line.startswith(name + "  "):
            return re.split(r"\s{2,}", line[len(name) :].strip())
    raise AssertionError(f"no row {name!r} in:\n{output}")


def test_bucket_quantiles_interpolate_as_prometheus_does() -> None:
    histogram = BucketCounts((0.1, 0.2, 0.4, float("inf")), (2, 6, 8, 10), 3.0)
    assert histogram.quantile(0.1) == pytest.approx(0.05)  # from 0 within the first bucket
    assert histogram.quantile(0.5) == pytest.approx(0.175)  # rank 5: 3 of the 4 in (0.1, 0.2]
    assert histogram.quantile(0.9) == 0.4  # in +Inf: the highest finite bound
    distribution = histogram.distribution()
    assert (distribution.count, distribution.mean) == (10, pytest.approx(0.3))
    assert BucketCounts((0.0, 1.0, float("inf")), (4, 4, 4), 0.0).quantile(0.5) == 0.0  # a bound at 0 is the value
    assert BucketCounts((0.1, float("inf")), (0, 0), 0.0).quantile(0.5) is None
    later = BucketCounts((0.1, 0.2, 0.4, float("inf")), (3, 9, 12, 15), 5.0).minus(histogram)
    assert (later.cumulative, later.total) == ((1, 3, 4, 5), 2.0)


async def test_one_scrape_summarises_every_figure_since_the_start(
    serve: type[Pages], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve(page())
    assert await run(["--live", server.url]) == 0
    output = capsys.readouterr().out
    assert output.startswith(f"Mirror agreement at {server.url}, since the gateway started\n")
    assert row(output, "") == ["a -> b"]
    assert row(output, "copies compared") == ["10"]
    assert row(output, "copies shed") == ["2"]
    assert row(output, "copies skipped") == ["4"]
    assert row(output, "copies cancelled") == ["1"]
    assert row(output, "error ENGINE_OVERLOADED (shadow)") == ["1"]
    assert row(output, "identical outputs (tokens)") == ["66.7% of 9"]
    assert row(output, "diverged at (tokens) mean") == ["4.0"]
    assert row(output, "diverged at (tokens) p50") == ["3.0"]  # rank 1.5: half of the one in (2, 4]
    assert row(output, "diverged at (tokens) p90") == ["6.8"]  # rank 2.7: 0.7 of the one in (4, 8]
    assert row(output, "finish reasons agree") == ["80.0% of 10"]  # 8 of 10: both unfinished do not count
    assert row(output, "TTFT primary (ms) p50") == ["100.00"]
    assert row(output, "TTFT primary (ms) p90") == ["180.00"]
    assert row(output, "TTFT primary (ms) p99") == ["198.00"]
    assert row(output, "TTFT shadow (ms) p50") == ["200.00"]  # all past the last finite bound
    assert row(output, "ITL primary (ms) p50") == ["10.00"]
    assert row(output, "ITL primary (ms) p90") == ["18.00"]
    assert row(output, "ITL shadow (ms) p50") == ["-"]
    assert "text" not in output


async def test_a_window_reports_the_difference_of_two_scrapes_with_rates(
    serve: type[Pages], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve(page(compared=10, ttft_fast=5), page(compared=30, ttft_fast=5))
    assert await run(["--live", server.url, "--window", "0.2"]) == 0
    output = capsys.readouterr().out
    assert re.match(rf"Mirror agreement at {re.escape(server.url)}, over 0\.[2-9]s from ", output)
    compared = row(output, "copies compared")[0]
    count, rate = re.fullmatch(r"(\d+) \((\d+\.\d\d)/s\)", compared).groups()  # type: ignore[union-attr]
    assert count == "20" and 20 / 0.2 * 0.5 < float(rate) <= 20 / 0.2
    assert row(output, "copies shed")[0].startswith("0 (0.00/s)")
    assert row(output, "identical outputs (tokens)") == ["-"]  # none in the window
    assert row(output, "diverged at (tokens) mean") == ["-"]
    assert row(output, "TTFT primary (ms) p50") == ["-"]


async def test_a_gateway_restarted_during_the_window_is_an_error(serve: type[Pages]) -> None:
    server = serve(page(compared=30), page(compared=4))
    with pytest.raises(BenchError, match="restarted"):
        await run(["--live", server.url, "--window", "0.05"])


async def test_the_report_plots_the_histograms(serve: type[Pages], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    server = serve(page())
    assert await run(["--live", server.url, "--report", str(tmp_path / "report")]) == 0
    names = sorted(path.name for path in (tmp_path / "report").iterdir())
    assert names == ["mirror_divergence_cdf.png", "mirror_itl_cdf.png", "mirror_ttft_cdf.png"]


async def test_a_page_with_no_pair_yet_exits_1(serve: type[Pages], capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(EMPTY)
    assert await run(["--live", server.url]) == 1
    assert "no mirrored request yet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ("# TYPE up gauge\nup 1\n", 200, "has no openengine_gateway_mirror_* metrics"),
        ("<html>not metrics</html>", 200, "is not a Prometheus metrics page"),
        ("gone", 404, "HTTP 404"),
    ],
)
def test_a_page_that_is_not_a_gateways_exits_2(
    serve: type[Pages], capsys: pytest.CaptureFixture[str], body: str, status: int, message: str
) -> None:
    server = serve(body, status=status)
    assert main(["bench", "--live", server.url]) == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"127.0.0.1:{free_port()}/metrics"
    assert main(["bench", "--live", url]) == 2
    assert f"cannot read http://{url}:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--live", "http://127.0.0.1:1/metrics", "--target", "127.0.0.1:1/a"], "unrecognized arguments: --target"),
        (["--live", "127.0.0.1:1", "--concurrency", "4"], "unrecognized arguments: --concurrency"),
        (["--live", "ftp://host/metrics"], "a metrics URL is http(s)://HOST:PORT[/PATH]"),
        (["--live", "127.0.0.1:1", "--window", "0"], "a window is a positive number of seconds"),
        (["--target", "127.0.0.1:1/a", "--window", "5"], "--window and --metrics-ca go with --live"),
        ([], "give --target HOST:PORT/MODEL (or --live METRICS_URL)"),
    ],
)
async def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        await run(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


async def test_a_real_gateways_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    async with gateway(server=ServerOptions(metrics_port=0)) as running:
        port = running.server.metrics_port
        agreement = running.gateway.agreement
        for shadow_tokens in ([1, 2, 3, 4], [1, 2, 9, 4]):
            agreement.compared(
                Side("mock", [[1, 2, 3, 4]], ["abcd"], ["LENGTH"], 0.05, [0.01, 0.01, 0.01]),
                Side("shadow", [shadow_tokens], ["abxd"], ["LENGTH"], 0.15, [0.03, 0.03, 0.03]),
                greedy=True,
                same_tokenizer=True,
            )
        agreement.shed("mock", "shadow")
        assert await run(["--live", f"http://127.0.0.1:{port}/metrics"]) == 0
    output = capsys.readouterr().out
    assert row(output, "") == ["mock -> shadow"]
    assert row(output, "copies compared") == ["2"]
    assert row(output, "copies shed") == ["1"]
    assert row(output, "identical outputs (tokens)") == ["50.0% of 2"]
    assert row(output, "diverged at (tokens) mean") == ["2.0"]
    assert row(output, "finish reasons agree") == ["100.0% of 2"]
    assert row(output, "TTFT primary (ms) p50") == ["37.50"]  # both in (0.025, 0.05]: rank 1 is halfway
    assert row(output, "TTFT shadow (ms) p50") == ["175.00"]  # both in (0.1, 0.25]: rank 1 is halfway


async def test_an_https_page_is_read_with_its_ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    certificates = issue_certificates(tmp_path)
    tls = TlsFiles(certificates.server.cert_file, certificates.server.key_file, None)
    credentials = grpc.ssl_channel_credentials(root_certificates=certificates.ca.cert)
    server = ServerOptions(tls=tls, metrics_port=0, metrics_tls=True)
    async with gateway(server=server, credentials=credentials) as running:
        running.gateway.agreement.shed("mock", "shadow")
        url = f"https://127.0.0.1:{running.server.metrics_port}/metrics"
        assert await run(["--live", url, "--metrics-ca", str(certificates.ca.cert_file)]) == 0
        assert row(capsys.readouterr().out, "copies shed") == ["1"]
        with pytest.raises(BenchError, match="CERTIFICATE_VERIFY_FAILED"):
            await run(["--live", url])
        with pytest.raises(BenchError, match=r"--metrics-ca .*missing\.pem"):
            await run(["--live", url, "--metrics-ca", str(tmp_path / "missing.pem")])


async def test_a_splits_engines_side_by_side_with_a_verdict_per_candidate(capsys: pytest.CaptureFixture[str]) -> None:
    """``slow`` takes 2 ms per prompt token before its first token and fails 30% of its requests; ``fast``
    neither: the verdict fails ``slow`` on TTFT and on errors, and the JSON carries the same."""
    backends = [("fast", mock(seed=1)), ("slow", mock(seed=2, prefill_time_per_token_s=0.002, fault_rate=0.3))]
    split = SplitSection(name="ab", engines={"fast": 1, "slow": 1})
    async with (
        serve_backends(backends, splits=[split], server_options=ServerOptions(metrics_port=0)) as running,
        await OpenEngineClient.connect(running.address) as client,
    ):

        async def one() -> None:
            request = text_request("a prompt of some twenty tokens or so, " * 2, model="ab", max_tokens=3)
            request.request_id = uuid.uuid4().hex
            with contextlib.suppress(EngineErrorEvent):
                await client.generate(request)

        for _ in range(10):
            await asyncio.gather(*(one() for _ in range(12)))
        url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
        assert await run(["--live", url, "--baseline", "fast"]) == 0
        output = capsys.readouterr().out
        assert await run(["--live", url, "--baseline", "fast", "--json", "-"]) == 0
        document = json.loads(capsys.readouterr().out)
    assert "Split ab at http://" in output and row(output, "")[:2] == ["fast (baseline)", "slow"]
    finished, failed = (int(n) for n in row(output, "requests finished / failed")[1].split(" / "))
    assert failed > 0 and row(output, "requests finished / failed")[0].endswith(" / 0")
    assert "slow against fast: fail" in output
    assert re.search(r"TTFT p90: .* Mann-Whitney p=.* \(n=\d+/\d+\): fail", output)
    assert re.search(r"error rate: \d+/\d+ vs 0/\d+, delta \+0\.\d+ \(95% CI .*\): fail", output)
    (ab,) = document["splits"]
    assert ab["baseline"] == "fast" and set(ab["engines"]) == {"fast", "slow"}
    verdict = ab["verdicts"]["slow"]
    assert verdict["result"] == "fail" and verdict["errors"]["result"] == "fail"
    assert verdict["latency"][0]["metric"] == "TTFT" and verdict["latency"][0]["result"] == "fail"
    assert verdict["latency"][0]["candidate_n"] == finished
    assert ab["engines"]["slow"]["requests"]["failed/INTERNAL"] == failed
