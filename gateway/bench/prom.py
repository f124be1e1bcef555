"""Reading a gateway's Prometheus page: its families by prefix, histograms, and the difference of two scrapes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from .errors import BenchError
from .stats import BucketCounts

K = TypeVar("K")

RESTARTED = "the gateway's counters went down during the window: the gateway restarted; run again"


def family_names(text: str, url: str) -> set[str]:
    """The names of the page's families, samples or not. Raises ``BenchError`` for a page that is not a
    Prometheus page."""
    try:
        return {family.name for family in text_string_to_metric_families(text)}
    except ValueError as error:
        raise BenchError(f"{url} is not a Prometheus metrics page ({error})") from None


def samples(text: str, url: str, prefix: str) -> dict[str, list[Sample]]:
    """The samples of the page's families named ``prefix...``, by sample name without the prefix (empty
    when it has none). Raises ``BenchError`` for a page that is not a Prometheus page."""
    try:
        families = [f for f in text_string_to_metric_families(text) if f.name.startswith(prefix)]
    except ValueError as error:
        raise BenchError(f"{url} is not a Prometheus metrics page ({error})") from None
    found: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            found.setdefault(sample.name.removeprefix(prefix), []).append(sample)
    return found


def histograms(buckets: list[Sample], sums: list[Sample]) -> Iterable[tuple[dict[str, str], BucketCounts]]:
    """Each labelled histogram of these ``_bucket`` and ``_sum`` samples, its labels without ``le``."""
    points: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for sample in buckets:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        points.setdefault(labels, []).append((float(sample.labels["le"]), sample.value))
    totals = {tuple(sorted(sample.labels.items())): sample.value for sample in sums}
    for labels, bucket_points in points.items():
        bucket_points.sort()
        bounds, cumulative = zip(*bucket_points, strict=True)
        yield dict(labels), BucketCounts(bounds, cumulative, totals.get(labels, 0.0))


def minus(now: Mapping[K, float], then: Mapping[K, float]) -> dict[K, float]:
    """Counters counted since ``then``; ``BenchError`` when one went down (a restart)."""
    difference = {key: value - then.get(key, 0.0) for key, value in now.items()}
    if set(then) - set(now) or any(value < 0 for value in difference.values()):
        raise BenchError(RESTARTED)
    return difference


def minus_histograms(now: Mapping[K, BucketCounts], then: Mapping[K, BucketCounts]) -> dict[K, BucketCounts]:
    """Histograms observed since ``then``; ``BenchError`` when one went down or changed its buckets."""
    try:
        difference = {key: histogram.minus(then[key]) if key in then else histogram for key, histogram in now.items()}
    except ValueError:  # other buckets: another gateway version
        raise BenchError(RESTARTED) from None
    if set(then) - set(now) or any(count < 0 for h in difference.values() for count in h.cumulative):
        raise BenchError(RESTARTED)
    return difference


__all__ = ["RESTARTED", "family_names", "histograms", "minus", "minus_histograms", "samples"]
