"""``openengine-gateway bench --live METRICS_URL``: how a running gateway's split engines compare, and
how its mirrors agree.

    openengine-gateway bench --live http://127.0.0.1:9100/metrics [--window 60] [--baseline ENGINE]
        [--json FILE] [--report DIR]

Per split, the engines side by side with a verdict per candidate (``splits``). Then it reads the
``openengine_gateway_mirror_*`` families of a gateway's Prometheus page (see
``server.metrics``) and prints, per (primary, shadow) pair of engines, the same kind of table as
an offline run: copies compared, shed, skipped and cancelled, engine errors, the share of identical greedy
outputs and where the others diverge, finish-reason agreement, and TTFT and ITL of each side.
Percentiles are interpolated within histogram buckets as Prometheus' ``histogram_quantile`` does,
so they are as fine as the buckets. One scrape covers everything since the gateway started; with
``--window S`` two scrapes S seconds apart cover that window, with rates per second.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..core.agreement import COPY_OUTCOMES, SIDES, UNFINISHED
from . import prom, splits
from .errors import BenchError, ReportError
from .plots import BucketPlot, prepare_directory, require_matplotlib, write_bucket_plots
from .report import number, table
from .stats import BucketCounts, Distribution

MIRROR = "openengine_gateway_mirror"
TIMEOUT_S = 10.0
"""Seconds a scrape may take."""

Pair = tuple[str, str]
"""(primary engine, shadow engine)."""


@dataclass
class PairCounters:
    """One pair's mirror families as scraped: counter values by their labels, histograms by theirs."""

    copies: dict[str, float] = field(default_factory=dict)
    """By outcome (``core.agreement.COPY_OUTCOMES``)."""
    errors: dict[tuple[str, str], float] = field(default_factory=dict)
    """By (side, ErrorCode name)."""
    outputs: dict[tuple[str, str], float] = field(default_factory=dict)
    """Greedy outputs by (basis, result): tokens or text, identical or diverged."""
    finish_reasons: dict[tuple[str, str], float] = field(default_factory=dict)
    """Outputs by (primary reason, shadow reason)."""
    divergence: dict[str, BucketCounts] = field(default_factory=dict)
    """By basis."""
    ttft: dict[str, BucketCounts] = field(default_factory=dict)
    """By side."""
    itl: dict[str, BucketCounts] = field(default_factory=dict)

    def minus(self, earlier: PairCounters) -> PairCounters:
        """What was counted since ``earlier``, a scrape of the same gateway."""
        return PairCounters(
            copies=prom.minus(self.copies, earlier.copies),
            errors=prom.minus(self.errors, earlier.errors),
            outputs=prom.minus(self.outputs, earlier.outputs),
            finish_reasons=prom.minus(self.finish_reasons, earlier.finish_reasons),
            divergence=prom.minus_histograms(self.divergence, earlier.divergence),
            ttft=prom.minus_histograms(self.ttft, earlier.ttft),
            itl=prom.minus_histograms(self.itl, earlier.itl),
        )


def difference(later: Mapping[Pair, PairCounters], earlier: Mapping[Pair, PairCounters]) -> dict[Pair, PairCounters]:
    """What each pair counted between two scrapes of one gateway; ``BenchError`` when it restarted between them."""
    if set(earlier) - set(later):
        raise BenchError(prom.RESTARTED)
    return {key: counters.minus(earlier.get(key, PairCounters())) for key, counters in later.items()}


def parse(text: str, url: str) -> dict[Pair, PairCounters]:
    """The mirror families of a Prometheus text page, by pair (none when it has no mirror families).
    Raises ``BenchError`` for a page that is not one."""
    samples = prom.samples(text, url, f"{MIRROR}_")
    pairs: dict[Pair, PairCounters] = {}

    def pair(labels: Mapping[str, str]) -> PairCounters:
        return pairs.setdefault((labels["primary"], labels["shadow"]), PairCounters())

    for sample in samples.get("copies_total", []):
        pair(sample.labels).copies[sample.labels["outcome"]] = sample.value
    for sample in samples.get("errors_total", []):
        pair(sample.labels).errors[sample.labels["side"], sample.labels["code"]] = sample.value
    for sample in samples.get("outputs_total", []):
        pair(sample.labels).outputs[sample.labels["basis"], sample.labels["result"]] = sample.value
    for sample in samples.get("finish_reasons_total", []):
        reasons = (sample.labels["primary_reason"], sample.labels["shadow_reason"])
        pair(sample.labels).finish_reasons[reasons] = sample.value
    histograms: list[tuple[str, str, Callable[[PairCounters], dict[str, BucketCounts]]]] = [
        ("divergence_position", "basis", lambda counters: counters.divergence),
        ("time_to_first_token_seconds", "side", lambda counters: counters.ttft),
        ("inter_token_latency_seconds", "side", lambda counters: counters.itl),
    ]
    for name, key, into in histograms:
        for labels, histogram in prom.histograms(samples.get(f"{name}_bucket", []), samples.get(f"{name}_sum", [])):
            into(pair(labels))[labels[key]] = histogram
    return pairs


def fetch(url: str, ca: Path | None = None) -> str:
    """The page at ``url``, checked against ``ca`` if given; ``BenchError`` when it cannot be read."""
    try:
        context = ssl.create_default_context(cafile=ca) if ca is not None else None
    except (OSError, ssl.SSLError) as error:
        raise BenchError(f"--metrics-ca {ca}: {error.strerror or error}") from None
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as response:
            return str(response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        raise BenchError(f"cannot read {url}: HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise BenchError(f"cannot read {url}: {error.reason}") from None
    except (OSError, ValueError) as error:
        raise BenchError(f"cannot read {url}: {error}") from None


def metrics_url(text: str) -> str:
    """A ``--live`` argument as a URL: ``host:port[/path]`` means ``http://host:port[/path]``."""
    url = text if "://" in text else f"http://{text}"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"a metrics URL is http(s)://HOST:PORT[/PATH], not {text!r}")
    return url


@dataclass(frozen=True)
class Basis:
    """Greedy output agreement of one pair in one basis (tokens or text)."""

    outputs: int
    identical: float | None
    """Share of outputs identical on both sides (``None`` without outputs)."""
    divergence: Distribution
    """First differing position of the diverged outputs."""


@dataclass(frozen=True)
class PairSummary:
    """One pair's figures over the scraped period (latencies in seconds)."""

    primary: str
    shadow: str
    copies: dict[str, int]
    errors: dict[tuple[str, str], int]
    agreement: dict[str, Basis]
    finished_outputs: int
    """Outputs with a finish reason on some side."""
    finish_agreement: float | None
    """Share of those whose two finish reasons are the same."""
    ttft: dict[str, Distribution]
    itl: dict[str, Distribution]
    seconds: float | None = None
    """The window's length, when the figures cover one (rates are given over it)."""

    @property
    def label(self) -> str:
        return f"{self.primary} -> {self.shadow}"


def summarize(pairs: Mapping[Pair, PairCounters], seconds: float | None = None) -> list[PairSummary]:
    """Each pair's summary, pairs in name order."""
    return [_summary(primary, shadow, pairs[primary, shadow], seconds) for primary, shadow in sorted(pairs)]


def _summary(primary: str, shadow: str, counters: PairCounters, seconds: float | None) -> PairSummary:
    agreement = {}
    for basis in sorted({basis for basis, _ in counters.outputs}):
        identical = int(counters.outputs.get((basis, "identical"), 0))
        outputs = identical + int(counters.outputs.get((basis, "diverged"), 0))
        divergence = counters.divergence.get(basis)
        agreement[basis] = Basis(outputs, identical / outputs if outputs else None, _distribution(divergence))
    finished = {pair: int(n) for pair, n in counters.finish_reasons.items() if set(pair) != {UNFINISHED}}
    total = sum(finished.values())
    same = sum(n for (ours, theirs), n in finished.items() if ours == theirs)
    return PairSummary(
        primary=primary,
        shadow=shadow,
        copies={outcome: int(counters.copies.get(outcome, 0)) for outcome in COPY_OUTCOMES},
        errors={key: int(n) for key, n in sorted(counters.errors.items()) if n},
        agreement=agreement,
        finished_outputs=total,
        finish_agreement=same / total if total else None,
        ttft={side: _distribution(counters.ttft.get(side)) for side in SIDES},
        itl={side: _distribution(counters.itl.get(side)) for side in SIDES},
        seconds=seconds,
    )


def _distribution(histogram: BucketCounts | None) -> Distribution:
    return histogram.distribution() if histogram is not None else Distribution.of([])


_UNITS = {"tokens": "tokens", "text": "chars"}


def to_text(summaries: list[PairSummary]) -> str:
    """One column per pair ("primary -> shadow"), one row per figure."""
    rows: list[tuple[str, list[str]]] = []
    for outcome in COPY_OUTCOMES:
        rows.append((f"copies {outcome}", [_count(s, s.copies[outcome]) for s in summaries]))
    for side, code in sorted({key for s in summaries for key in s.errors}):
        rows.append((f"error {code} ({side})", [_count(s, s.errors.get((side, code), 0)) for s in summaries]))
    for basis in sorted({basis for s in summaries for basis in s.agreement}):
        agreements = [s.agreement.get(basis) for s in summaries]
        rows.append((f"identical outputs ({basis})", [_identical(a) for a in agreements]))
        for stat in ("mean", "p50", "p90"):
            name = f"diverged at ({_UNITS.get(basis, basis)}) {stat}"
            rows.append((name, [_position(a, stat) for a in agreements]))
    rows.append(("finish reasons agree", [_share(s.finish_agreement, s.finished_outputs) for s in summaries]))
    for label, name in (("TTFT", "ttft"), ("ITL", "itl")):
        for side in SIDES:
            for stat in ("p50", "p90", "p99"):
                rows.append((f"{label} {side} (ms) {stat}", [_ms(s, name, side, stat) for s in summaries]))
    return "\n".join(table([s.label for s in summaries], rows))


def _count(summary: PairSummary, count: int) -> str:
    if summary.seconds is None:
        return str(count)
    return f"{count} ({count / summary.seconds:.2f}/s)"


def _share(share: float | None, of: int) -> str:
    return "-" if share is None else f"{share * 100:.1f}% of {of}"


def _identical(basis: Basis | None) -> str:
    return "-" if basis is None else _share(basis.identical, basis.outputs)


def _position(basis: Basis | None, stat: str) -> str:
    return "-" if basis is None else number(getattr(basis.divergence, stat))


def _ms(summary: PairSummary, name: str, side: str, stat: str) -> str:
    value: float | None = getattr(getattr(summary, name)[side], stat)
    return number(None if value is None else value * 1000.0, 2)


def plots(pairs: Mapping[Pair, PairCounters]) -> list[BucketPlot]:
    """TTFT and ITL CDFs of each pair's sides, and where greedy outputs diverge."""
    return [
        BucketPlot(
            "mirror_ttft_cdf.png",
            "Time to first token, mirrored requests",
            "milliseconds (log scale)",
            "log",
            _curves(pairs, "ttft"),
            1000.0,
        ),
        BucketPlot(
            "mirror_itl_cdf.png",
            "Inter-token latency, mirrored requests",
            "milliseconds (log scale)",
            "log",
            _curves(pairs, "itl"),
            1000.0,
        ),
        BucketPlot(
            "mirror_divergence_cdf.png",
            "First divergence of diverged greedy outputs",
            "token or character",
            "symlog",
            _curves(pairs, "divergence"),
        ),
    ]


def _curves(pairs: Mapping[Pair, PairCounters], histograms: str) -> dict[str, BucketCounts]:
    """One histogram field of every pair, labelled "primary -> shadow SIDE" (or BASIS)."""
    return {
        f"{primary} -> {shadow} {key}": histogram
        for (primary, shadow), counters in sorted(pairs.items())
        for key, histogram in sorted(getattr(counters, histograms).items())
    }


def add_live_options(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--live`` and the options that go with it, for ``bench --help`` and for the live parser."""
    live = parser.add_argument_group("live (a running gateway's mirrors instead of a workload)")
    live.add_argument(
        "--live",
        required=required,
        type=_typed_url,
        metavar="METRICS_URL",
        help="summarise the mirror metrics of the gateway serving this /metrics page (http://, https://)",
    )
    live.add_argument(
        "--window", type=_typed_seconds, metavar="S", help="with --live: report the S seconds from now, with rates"
    )
    live.add_argument("--metrics-ca", type=Path, metavar="FILE", help="with --live: CA certificate (PEM) of https://")
    live.add_argument(
        "--baseline",
        metavar="ENGINE",
        help="with --live: the engine (served name) each split's candidates are judged against, in the splits that "
        "have it (default: the engine that answered the most)",
    )


def _typed_url(text: str) -> str:
    try:
        return metrics_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _typed_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a window is a positive number of seconds, not {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The options ``--live`` takes: any offline one (``--target``, the load, the workload) is an error."""
    live = argparse.ArgumentParser(
        prog="openengine-gateway bench",
        description="Summarise how a running gateway's mirrored engines agree, from its Prometheus metrics.",
    )
    add_live_options(live, required=True)
    live.add_argument(
        "--report", type=Path, metavar="DIR", help="write PNG plots into this directory (needs matplotlib)"
    )
    live.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the splits' figures and verdicts and the mirrors' as JSON "
        "to this file ('-' for stdout, instead of the tables)",
    )
    return live


@dataclass(frozen=True)
class Page:
    """What ``--live`` reads of one scrape: the mirror pairs and the engines of each split."""

    pairs: dict[Pair, PairCounters]
    members: dict[splits.Member, splits.EngineCounters]

    @classmethod
    def read(cls, text: str, url: str) -> Page:
        """The page's families; ``BenchError`` when it has neither the mirror nor the engine families."""
        names = prom.family_names(text, url)
        if not any(name.startswith((f"{MIRROR}_", f"{splits.ENGINE}_")) for name in names):
            raise BenchError(
                f"{url} has no {MIRROR}_* metrics (nor {splits.ENGINE}_*): not an openengine-gateway metrics page, "
                "or an older one"
            )
        return cls(parse(text, url), splits.parse(text, url))

    def since(self, earlier: Page) -> Page:
        """What was counted between ``earlier`` and this scrape."""
        return Page(difference(self.pairs, earlier.pairs), splits.difference(self.members, earlier.members))


async def run(argv: list[str]) -> int:
    """``bench --live ...``: 0 after a summary, 1 when no split served and nothing was copied, 2
    (``BenchError``) when the page cannot be read or has neither mirror nor engine metrics."""
    live = parser()
    args = live.parse_args(argv)
    if args.report is not None:
        require_matplotlib()
        try:
            prepare_directory(args.report)
        except ReportError as error:
            live.error(f"--report {args.report}: {error}")
    url: str = args.live
    started = datetime.now(UTC)
    page = Page.read(await asyncio.to_thread(fetch, url, args.metrics_ca), url)
    seconds: float | None = None
    period = "since the gateway started"
    if args.window is not None:
        began = time.monotonic()
        await asyncio.sleep(args.window)
        later = Page.read(await asyncio.to_thread(fetch, url, args.metrics_ca), url)
        seconds = time.monotonic() - began
        page = later.since(page)
        period = f"over {seconds:.1f}s from {started:%Y-%m-%d %H:%M:%S %Z}"
    summaries = summarize(page.pairs, seconds)
    agreement = {(s.primary, s.shadow): _agreement(s) for s in summaries}
    comparisons = splits.compare(page.members, agreement, args.baseline)
    if not page.pairs and not comparisons:
        print(
            f"openengine-gateway bench: {url}: no mirrored request yet (does the gateway have [[mirrors]]?), "
            "and no request through a split",
            file=sys.stderr,
        )
        return 1
    if args.json is not None:
        document = {
            "url": url,
            "period": period,
            "method": splits.method(),
            "splits": [splits.to_json(comparison, seconds) for comparison in comparisons],
            "mirrors": [_pair_json(summary) for summary in summaries],
        }
        text = json.dumps(document, indent=2, default=str)
        if str(args.json) == "-":
            print(text)
            return 0
        args.json.write_text(text + "\n")
    for comparison in comparisons:
        print(f"Split {comparison.split} at {url}, {period}")
        print(splits.to_text(comparison, seconds))
        print()
    if comparisons:
        print(splits.method())
    if page.pairs:
        print(f"Mirror agreement at {url}, {period}")
        print(to_text(summaries))
    if args.report is not None and page.pairs:
        written = write_bucket_plots(plots(page.pairs), args.report, f"{url}, {period}")
        print(f"report: {', '.join(p.name for p in written)} in {args.report}")
    served = any(sum(c.requests.values()) for counters in comparisons for c in counters.engines.values())
    return 0 if served or any(sum(s.copies.values()) for s in summaries) else 1


def _agreement(summary: PairSummary) -> tuple[int, int]:
    """(identical, compared) greedy outputs of a pair, over both bases."""
    outputs = sum(basis.outputs for basis in summary.agreement.values())
    identical = sum(round((basis.identical or 0) * basis.outputs) for basis in summary.agreement.values())
    return identical, outputs


def _pair_json(summary: PairSummary) -> dict[str, object]:
    values = dataclasses.asdict(summary)
    values["errors"] = {f"{side}/{code}": n for (side, code), n in summary.errors.items()}
    return values


__all__ = [
    "MIRROR",
    "Basis",
    "PairCounters",
    "PairSummary",
    "add_live_options",
    "difference",
    "fetch",
    "metrics_url",
    "parse",
    "parser",
    "plots",
    "run",
    "summarize",
    "to_text",
]
