"""``bench.report``: the side-by-side table and the JSON document; and which modules stay pure."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from openengine_gateway.bench import RequestRecord, Target, TargetRun, compare, to_json, to_text

BENCH = Path(__file__).resolve().parents[2] / "gateway" / "bench"
PURE = ("arrivals", "errors", "progress", "prompts", "records", "report", "stats", "workload", "plots")


def _runs() -> list[TargetRun]:
    ok = RequestRecord(0, 0.0, 0.5, [0.1, 0.3], [1, 2], [4, 5, 6], prompt_tokens=9, completion_tokens=3)
    failed = RequestRecord(1, 0.0, 0.01, error="RESOURCE_EXHAUSTED")
    other = RequestRecord(0, 0.0, 0.4, [0.1, 0.2, 0.3], [1, 1, 1], [4, 5, 7], prompt_tokens=9, completion_tokens=3)
    return [
        TargetRun(Target("h:1", "a"), "mock 1", 1.0, [ok, failed]),
        TargetRun(Target("h:2"), "other 2", float("inf"), [other]),
    ]


def test_table_has_a_column_per_target_and_a_row_per_error_code() -> None:
    table = to_text(compare(_runs(), greedy=True)).splitlines()
    assert table[0].split() == ["h:1/a", "h:2"]
    assert len({len(line) for line in table}) == 1, "columns line up"
    rows = {line[:24].strip(): line[24:].split() for line in table[1:]}
    assert rows["requests ok / failed"] == ["1", "/", "1", "1", "/", "0"]
    assert rows["error RESOURCE_EXHAUSTED"] == ["1", "0"]
    assert rows["TTFT (ms) mean"] == ["100.00", "100.00"]
    assert rows["identical outputs"] == ["baseline", "0.0%", "of", "1"], "of the requests both completed"
    assert rows["common prefix"] == ["baseline", "66.7%", "of", "1"]
    assert rows["prompt tokens (cached)"] == ["9", "(-)", "9", "(-)"]


def test_json_holds_settings_summaries_requests_and_no_infinities() -> None:
    runs = _runs()
    document = json.loads(to_json(compare(runs, greedy=False), runs, {"request_rate": float("inf")}))
    assert document["settings"] == {"request_rate": "inf"} and document["agreement"] == []
    first, second = document["targets"]
    assert (first["target"], first["requests"], first["errors"]) == ("h:1/a", 2, {"RESOURCE_EXHAUSTED": 1})
    assert [r["error"] for r in first["per_request"]] == [None, "RESOURCE_EXHAUSTED"]
    assert first["per_request"][0] == {
        "index": 0,
        "scheduled_s": None,
        "started_s": 0.0,
        "ttft_s": 0.1,
        "e2e_s": 0.5,
        "output_tokens": 3,
        "completion_tokens": 3,
        "messages": 2,
        "error": None,
        "error_message": "",
    }
    assert second["duration_s"] == "inf" and first["itl_s"]["p50"] == pytest.approx(0.2)


def test_pure_modules_import_no_grpc_and_no_matplotlib_at_import_time() -> None:
    for name in PURE:
        tree = ast.parse((BENCH / f"{name}.py").read_text())
        imported = set()
        for node in tree.body:  # module level only: a function's or TYPE_CHECKING's import is lazy
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
        forbidden = {"grpc", "matplotlib", "..pb", "..client", ".runner", ".cli"}
        assert not {i for i in imported if i.split(".")[0] in forbidden or i in forbidden}, name
