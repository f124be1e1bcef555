"""A canary that drives itself: a split's candidate engine stepped up while it holds against its baseline.

A split with an ``analysis`` table (``config.AnalysisSection``) starts its candidate at the first
step's weight (percent of the two engines' traffic; the baseline has the rest). Each step lasts at
least ``step_s`` and ``step_requests`` candidate requests; then ``judge`` compares what the two
engines answered *during the step* through the split (the gateway's own telemetry, the same figures
``bench --live`` reads): TTFT and ITL by the Mann-Whitney U test and a percentile ratio, the error-rate
difference's interval, and the greedy agreement of a mirror from the split to the candidate when
``agreement`` is a limit. A verdict that holds moves the candidate to the next step (the last, 100, is
the promotion); a failed limit rolls it back to 0 and stops; too little traffic waits. Each decision is
an audit line, a metric and part of ``GetRoutes``; an operator pauses, resumes, promotes or aborts it
(``ControlCanary``, or a reload with ``paused``). Weights change by swapping the whole route table
(``Gateway.reroute``), so a request in flight keeps its engine and sticky keys move only as weights
require.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import judge
from ..bench.stats import BucketCounts
from ..config import AnalysisSection, SplitSection
from ..errors import FailedPrecondition, NotFound
from ..routes import plan_routes
from .agreement import Agreement
from .audit import audit
from .callers import Caller
from .telemetry import EngineStats, Histogram, Telemetry

log = logging.getLogger(__name__)

RUNNING, PAUSED, PROMOTED, ROLLED_BACK, ABORTED = "running", "paused", "promoted", "rolled back", "aborted"
STATES = (RUNNING, PAUSED, PROMOTED, ROLLED_BACK, ABORTED)
ACTIONS = ("pause", "resume", "promote", "abort")
"""What an operator may do to a canary."""
DECISIONS = ("step", "wait", "promote", "rollback", "pause", "resume", "abort")
"""Counted per split in ``openengine_gateway_canary_decisions_total``."""


@dataclass(frozen=True, slots=True)
class AnalysisCaller(Caller):
    """The canary itself, deciding on its evidence: the caller of its audit lines."""

    def describe(self) -> str:
        return "the canary analysis"


@dataclass(frozen=True)
class _Mark:
    """What one engine had counted through the split at some moment (a step's start, or now)."""

    finished: int
    failed: int
    ttft: BucketCounts
    itl: BucketCounts

    def since(self, then: _Mark) -> judge.Window:
        """What was counted between ``then`` and this mark."""
        return judge.Window(
            self.finished - then.finished,
            self.failed - then.failed,
            self.ttft.minus(then.ttft),
            self.itl.minus(then.itl),
        )


def _mark(stats: EngineStats | None) -> _Mark:
    stats = stats or EngineStats()
    finished = failed = 0
    for (kind, outcome, _code), count in list(stats.requests.items()):
        if kind == "generate":
            finished += count if outcome == "finished" else 0
            failed += count if outcome == "failed" else 0
    return _Mark(finished, failed, _buckets(stats.ttft), _buckets(stats.itl))


def _buckets(histogram: Histogram) -> BucketCounts:
    pairs = histogram.cumulative()
    return BucketCounts(tuple(bound for bound, _ in pairs), tuple(float(n) for _, n in pairs), histogram.total)


@dataclass
class Canary:
    """One split's analysis run, from its start to a promotion, a rollback or an abort."""

    split: str
    section: AnalysisSection
    baseline: str
    """The baseline engine's served name."""
    candidate: str
    state: str = RUNNING
    step: int = 0
    """Index into ``section.steps``."""
    evidence: list[str] = field(default_factory=list)
    """Each decision's line, oldest first."""
    decisions: Counter[str] = field(default_factory=Counter)
    _began: float = 0.0
    _marks: tuple[_Mark, _Mark, tuple[int, int]] | None = None
    """The baseline's and the candidate's marks and the mirror's (identical, compared) at the step's start."""
    _waiting: bool = False

    @property
    def weight(self) -> int:
        """The candidate's weight now: its step's, 0 once rolled back or aborted, 100 once promoted."""
        if self.state in (ROLLED_BACK, ABORTED):
            return 0
        return 100 if self.state == PROMOTED else self.section.steps[self.step]

    @property
    def done(self) -> bool:
        return self.state in (PROMOTED, ROLLED_BACK, ABORTED)

    def begin(self, telemetry: Telemetry, agreement: Agreement, now: float) -> None:
        """Start the current step's window now."""
        self._began = now
        self._waiting = False
        self._marks = (
            _mark(telemetry.engines.get((self.baseline, self.split))),
            _mark(telemetry.engines.get((self.candidate, self.split))),
            _agreed(agreement, self.baseline, self.candidate),
        )

    def verdict(self, telemetry: Telemetry, agreement: Agreement) -> judge.Verdict:
        """The candidate against the baseline over the step so far."""
        assert self._marks is not None, "begin() starts every step"
        baseline, candidate, (identical_then, compared_then) = self._marks
        ours = _mark(telemetry.engines.get((self.baseline, self.split))).since(baseline)
        theirs = _mark(telemetry.engines.get((self.candidate, self.split))).since(candidate)
        identical, compared = _agreed(agreement, self.baseline, self.candidate)
        mirrored = (identical - identical_then, compared - compared_then) if compared else None
        return judge.judge(ours, theirs, _limits(self.section), mirrored)

    def tick(self, telemetry: Telemetry, agreement: Agreement, now: float) -> bool:
        """Judge the step when it has lasted long enough; True when the weights changed."""
        section = self.section
        if self.state != RUNNING or now - self._began < section.step_s:
            return False
        assert self._marks is not None, "begin() starts every step"
        answered = _mark(telemetry.engines.get((self.candidate, self.split))).since(self._marks[1])
        if answered.finished + answered.failed < section.step_requests:
            return False
        verdict = self.verdict(telemetry, agreement)
        at = f"step {self.step + 1} ({self.candidate} {self.weight}%)"
        if verdict.result == "fail":
            self.state = ROLLED_BACK
            self.decide("rollback", f"rolled back at {at}: {'; '.join(verdict.failing)}; {self.candidate} set to 0")
            return True
        if verdict.result == "not enough data":
            if not self._waiting:
                self._waiting = True
                lacking = [check.describe() for check in verdict.checks if check.result == "not enough data"]
                self.decide("wait", f"waits at {at} for traffic: {'; '.join(lacking)}")
            return False
        held = "; ".join(check.describe() for check in verdict.checks)
        if self.step + 1 >= len(section.steps) - 1:
            self.state = PROMOTED
            self.decide("promote", f"held at {at}: {held}; {self.candidate} promoted to 100%")
        else:
            self.step += 1
            self.decide("step", f"held at {at}: {held}; {self.candidate} up to {self.weight}%")
        self.begin(telemetry, agreement, now)
        return True

    def control(self, action: str, caller: Caller, telemetry: Telemetry, agreement: Agreement) -> bool:
        """An operator's ``action`` (``ACTIONS``); True when the weights changed. ``FailedPrecondition``
        when the canary has ended, or is not in a state the action applies to."""
        if self.done:
            raise FailedPrecondition(f"the canary of split {self.split!r} has ended ({self.state}): {action} nothing")
        if action == "pause":
            if self.state == PAUSED:
                raise FailedPrecondition(f"the canary of split {self.split!r} is paused already")
            self.state = PAUSED
        elif action == "resume":
            if self.state == RUNNING:
                raise FailedPrecondition(f"the canary of split {self.split!r} is running already")
            self.state = RUNNING
            self.begin(telemetry, agreement, time.monotonic())
        else:
            self.state = PROMOTED if action == "promote" else ABORTED
        line = f"{self.state} by {caller.describe()} at step {self.step + 1}; {self.candidate} at {self.weight}%"
        self.decide(action, line, caller)
        return action in ("promote", "abort")

    def decide(self, decision: str, line: str, caller: Caller | None = None) -> None:
        self.decisions[decision] += 1
        self.evidence.append(line)
        audit(f"canary of split {self.split!r}: {line}", caller or AnalysisCaller())


def _agreed(agreement: Agreement, baseline: str, candidate: str) -> tuple[int, int]:
    """(identical, compared) greedy outputs of the mirror pair (baseline, candidate) so far."""
    stats = agreement.pairs.get((baseline, candidate))
    if stats is None:
        return 0, 0
    identical = sum(stats.identical.values())
    return identical, identical + sum(stats.diverged.values())


def _limits(section: AnalysisSection) -> judge.Limits:
    limits = section.limits
    ttft, itl = limits.ttft, limits.itl
    return judge.Limits(
        ttft_percentile=ttft.percentile if ttft else 90.0,
        ttft_max_ratio=ttft.max_ratio if ttft else None,
        itl_percentile=itl.percentile if itl else 90.0,
        itl_max_ratio=itl.max_ratio if itl else None,
        max_error_delta=limits.error_rate_delta,
        min_agreement=limits.agreement,
        alpha=section.alpha,
        confidence=section.confidence,
        min_samples=section.min_samples,
    )


class Canaries:
    """Every split's canary, one per gateway: kept across reloads while a split's analysis stays the same."""

    def __init__(self, telemetry: Telemetry, agreement: Agreement, names: Mapping[str, str]) -> None:
        """``names``: every engine's served name and alias -> its served name."""
        self.telemetry = telemetry
        self.agreement = agreement
        self._names = dict(names)
        self.running: dict[str, Canary] = {}
        """By split name."""

    def plan(self, splits: Sequence[SplitSection]) -> tuple[dict[str, Canary], list[SplitSection]]:
        """The canaries ``splits`` call for (the running ones whose analysis is unchanged but for ``paused``,
        new ones started at their first step) and the sections with their weights; ``commit`` applies them."""
        plan_routes(self._names, splits, [])  # names checked before any canary reads them
        canaries: dict[str, Canary] = {}
        now = time.monotonic()
        for split in splits:
            analysis = split.analysis
            if analysis is None:
                continue
            canary = self.running.get(split.name)
            if canary is None or _unpaused(canary.section) != _unpaused(analysis):
                canary = Canary(split.name, analysis, self._names[analysis.baseline], self._names[analysis.candidate])
                canary.state = PAUSED if analysis.paused else RUNNING
                canary.begin(self.telemetry, self.agreement, now)
            canaries[split.name] = canary
        return canaries, [self._weighted(split, canaries.get(split.name)) for split in splits]

    def commit(self, canaries: dict[str, Canary], splits: Sequence[SplitSection]) -> None:
        """Run ``canaries`` from now on (their routes are served); audit what started, stopped or was paused."""
        for name, canary in canaries.items():
            running = self.running.get(name)
            analysis = next(split.analysis for split in splits if split.name == name)
            assert analysis is not None
            if running is not canary:
                state = "paused" if canary.state == PAUSED else "started"
                canary.decide("step", f"{state} at step 1: {canary.candidate} at {canary.weight}%")
            elif not canary.done and analysis.paused != (canary.state == PAUSED):
                canary.state = PAUSED if analysis.paused else RUNNING
                if canary.state == RUNNING:
                    canary.begin(self.telemetry, self.agreement, time.monotonic())
                canary.decide("pause" if analysis.paused else "resume", f"{canary.state} by a reload")
        for name in set(self.running) - set(canaries):
            audit(f"canary of split {name!r}: stopped (its analysis was removed by a reload)", AnalysisCaller())
        self.running = canaries

    def weighted(self, splits: Sequence[SplitSection]) -> list[SplitSection]:
        """``splits`` with each canary's weights."""
        return [self._weighted(split, self.running.get(split.name)) for split in splits]

    def _weighted(self, split: SplitSection, canary: Canary | None) -> SplitSection:
        if canary is None:
            return split
        weights = dict(split.engines)
        for key in weights:
            served = self._names.get(key)
            if served == canary.baseline:
                weights[key] = 100 - canary.weight
            elif served == canary.candidate:
                weights[key] = canary.weight
        return split.model_copy(update={"engines": weights})

    def tick(self) -> bool:
        """Judge every running canary; True when some weight changed."""
        now = time.monotonic()
        return any([canary.tick(self.telemetry, self.agreement, now) for canary in list(self.running.values())])

    def control(self, split: str, action: str, caller: Caller) -> bool:
        """An operator's action on a split's canary; True when the weights changed. ``NotFound`` when the split
        has no canary."""
        canary = self.running.get(split)
        if canary is None:
            have = ", ".join(self.running) or "none"
            raise NotFound(f"split {split!r} has no canary (canaries: {have})")
        return canary.control(action, caller, self.telemetry, self.agreement)

    def interval_s(self) -> float:
        """How often to judge: a tenth of the shortest step, between 50 ms and 1 s."""
        steps = [canary.section.step_s for canary in self.running.values()]
        return min(1.0, max(0.05, min(steps, default=1.0) / 10))


def _unpaused(section: AnalysisSection) -> AnalysisSection:
    return section.model_copy(update={"paused": False})


__all__ = ["ACTIONS", "DECISIONS", "STATES", "AnalysisCaller", "Canaries", "Canary"]
