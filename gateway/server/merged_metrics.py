"""One metrics page for several frontend processes (``--frontends``): the supervisor's.

At each scrape the supervisor asks every frontend for its page (``peers.fetch_metrics``) and
merges them, family by family and sample by sample:

* what counts this process's own calls, requests, tokens, subscribers and latencies (every counter,
  histogram and gateway gauge) is summed over the processes;
* what describes an engine they share (``engine_running_requests``, ``engine_queued_requests``,
  ``engine_health``) comes, per model, from the process that heard from the engine last;
* ``serving`` is 1 only while every process serves; a counter's ``_created`` is the earliest.

A frontend that does not answer is left out of that scrape (and logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from .metrics import PREFIX

log = logging.getLogger(__name__)

ENGINE_FAMILIES = frozenset(
    f"{PREFIX}_{name}" for name in ("engine_running_requests", "engine_queued_requests", "engine_health")
)
"""Families that describe a shared engine, per ``model`` label: taken from the freshest process."""
ALL_FAMILIES = frozenset({f"{PREFIX}_serving"})
"""Families that hold only while every process holds them: the least value is taken."""

Page = Mapping[str, Any]
"""One frontend's answer: ``exposition`` (its text page) and ``load_timestamps`` (model -> ns or None)."""


def merge_pages(pages: Sequence[Page]) -> list[Metric]:
    """The merged families of every frontend's page (see the module's rules)."""
    freshest = _freshest_by_model(pages)
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for index, page in enumerate(pages):
        for family in text_string_to_metric_families(page["exposition"]):
            families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            samples = values.setdefault(family.name, {})
            for sample in family.samples:
                if family.name in ENGINE_FAMILIES and freshest.get(sample.labels.get("model", "")) != index:
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in samples:
                    samples[key] = sample.value
                elif sample.name.endswith("_created") or family.name in ALL_FAMILIES:
                    samples[key] = min(samples[key], sample.value)
                else:
                    samples[key] += sample.value
    result = []
    for name, family in families.items():
        family.samples = [Sample(sample, dict(labels), value) for (sample, labels), value in values[name].items()]
        result.append(family)
    return result


def _freshest_by_model(pages: Sequence[Page]) -> dict[str, int]:
    """Per model, the index of the page whose engine load was measured last (the first on a tie)."""
    best: dict[str, tuple[int, int]] = {}
    for index, page in enumerate(pages):
        for model, stamp in page.get("load_timestamps", {}).items():
            when = stamp if stamp is not None else -1
            if model not in best or when > best[model][0]:
                best[model] = (when, index)
    return {model: index for model, (_, index) in best.items()}


class MergedCollector(Collector):
    """Collects the merged page of the frontends ``fetch`` reads (from the metrics server's thread)."""

    def __init__(self, fetchers: Sequence[Callable[[], Page]]) -> None:
        self._fetchers = list(fetchers)

    def collect(self) -> Iterator[Metric]:
        pages = []
        for number, fetch in enumerate(self._fetchers):
            try:
                pages.append(fetch())
            except Exception as exc:  # broad on purpose: one frontend down must not blank the page
                log.warning("frontend %d gave no metrics: %s", number, exc)
        yield from merge_pages(pages)


__all__ = ["ALL_FAMILIES", "ENGINE_FAMILIES", "MergedCollector", "Page", "merge_pages"]
