"""Conformance results as a terminal report and as JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from .kit import Outcome, Result

_MARK = {Outcome.PASSED: "PASS", Outcome.FAILED: "FAIL", Outcome.NOT_APPLICABLE: "N/A "}


def summary(results: Sequence[Result]) -> dict[str, int]:
    """How many rules passed, failed and did not apply."""
    counts = Counter(r.outcome for r in results)
    return {outcome.value: counts.get(outcome, 0) for outcome in Outcome}


def to_text(results: Sequence[Result], target: str) -> str:
    """One line per rule, failures with their reason, then totals."""
    lines = [f"OpenEngine conformance against {target}"]
    for result in results:
        line = f"  {_MARK[result.outcome]}  {result.rule.id}"
        if result.message:
            line += f"  -- {result.message}"
        lines.append(line)
    totals = summary(results)
    lines.append(f"{totals['passed']} passed, {totals['failed']} failed, {totals['not_applicable']} not applicable")
    return "\n".join(lines)


def to_json(results: Sequence[Result], target: str) -> str:
    """The results with each rule's section and quoted text."""
    return json.dumps(
        {
            "target": target,
            "summary": summary(results),
            "rules": [
                {
                    "id": r.rule.id,
                    "section": r.rule.section,
                    "text": r.rule.text,
                    "outcome": r.outcome.value,
                    "message": r.message,
                    "seconds": round(r.seconds, 4),
                }
                for r in results
            ],
        },
        indent=2,
    )


__all__ = ["summary", "to_json", "to_text"]
