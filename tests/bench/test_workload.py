"""``bench.workload``, ``prompts`` and ``arrivals``: seeded, the same for every target, as specified."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest
from openengine_gateway.bench import Lengths, Workload, WorkloadError, WorkloadSpec, arrival_offsets, load_prompts


def _first(spec: WorkloadSpec, count: int) -> list[object]:
    workload = Workload(spec)
    return [workload.request(i) for i in range(count)]


def test_lengths_parse_fixed_and_ranges() -> None:
    assert Lengths.parse("128") == Lengths(128, 128) and str(Lengths.parse("128")) == "128"
    assert Lengths.parse("16:64") == Lengths(16, 64) and str(Lengths(16, 64)) == "16:64"
    for bad in ("x", "64:16", "-1", "1:2:3"):
        with pytest.raises(WorkloadError):
            Lengths.parse(bad)


def test_the_sequence_depends_only_on_the_seed_and_index() -> None:
    spec = WorkloadSpec(seed=3, prompt_lengths=Lengths(8, 64), output_lengths=Lengths(1, 32))
    late = Workload(spec)
    out_of_order = [late.request(i) for i in (9, 2, 0, 5)]
    ordered = _first(spec, 10)
    assert out_of_order == [ordered[i] for i in (9, 2, 0, 5)]
    assert _first(spec, 10) == ordered
    assert _first(WorkloadSpec(seed=4, prompt_lengths=Lengths(8, 64)), 10) != ordered


def test_lengths_follow_their_distributions() -> None:
    workload = Workload(WorkloadSpec(prompt_lengths=Lengths(10, 20), output_lengths=Lengths(5, 5)))
    requests = [workload.request(i) for i in range(400)]
    prompt_lengths = {len(r.prompt) for r in requests}
    assert prompt_lengths == set(range(10, 21)), "uniform over the range, both ends included"
    assert {r.max_tokens for r in requests} == {5}
    assert all(isinstance(r.prompt, str) and r.prompt.isascii() for r in requests)
    assert all(r.send_at is None and r.group is None for r in requests)


def test_shared_prefix_groups() -> None:
    spec = WorkloadSpec(prompt_lengths=Lengths(20, 20), prefix_groups=3, prefix_length=50)
    requests = _first(spec, 9)
    assert [r.group for r in requests] == [0, 1, 2] * 3
    prefixes = {r.group: r.prompt[:50] for r in requests}
    assert all(r.prompt[:50] == prefixes[r.group] and len(r.prompt) == 70 for r in requests)
    assert len(set(prefixes.values())) == 3
    assert len({r.prompt[50:] for r in requests}) == 9
    with pytest.raises(WorkloadError, match="both"):
        WorkloadSpec(prefix_groups=3)


def test_token_id_prompts() -> None:
    spec = WorkloadSpec(prompt_lengths=Lengths(30, 30), prefix_groups=2, prefix_length=10, vocab_size=50)
    first, second, third = _first(spec, 3)
    assert isinstance(first.prompt, tuple) and len(first.prompt) == 40
    assert all(0 <= t < 50 for t in first.prompt)
    assert first.prompt[:10] == third.prompt[:10] != second.prompt[:10]


def test_warmup_requests_are_shaped_alike_but_not_the_measured_ones() -> None:
    workload = Workload(WorkloadSpec(prompt_lengths=Lengths(40, 40), request_rate=5.0))
    warmup = workload.warmup(3)
    assert [len(r.prompt) for r in warmup] == [40, 40, 40] and all(r.send_at is None for r in warmup)
    assert {r.prompt for r in warmup}.isdisjoint(workload.request(i).prompt for i in range(3))


def test_prompts_file_jsonl_and_lines(tmp_path: Path) -> None:
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "one", "output_len": 7}\n\n{"prompt": "two"}\n{"prompt": "three"}\n')
    entries = load_prompts(jsonl)
    assert [(e.text, e.output_length) for e in entries] == [("one", 7), ("two", None), ("three", None)]
    lines = tmp_path / "prompts.txt"
    lines.write_text("first prompt\n\nsecond {not json}\n")
    assert [e.text for e in load_prompts(lines)] == ["first prompt", "second {not json}"]

    workload = Workload(WorkloadSpec(prompts=entries, output_lengths=Lengths(3, 3), seed=1))
    requests = [workload.request(i) for i in range(6)]
    assert sorted(r.prompt for r in requests[:3]) == sorted(r.prompt for r in requests[3:]) == ["one", "three", "two"]
    assert {r.prompt: r.max_tokens for r in requests} == {"one": 7, "two": 3, "three": 3}


def test_a_json_file_may_hold_one_array_of_prompts(tmp_path: Path) -> None:
    array = tmp_path / "prompts.json"
    array.write_text('[\n  {"prompt": "one", "output_len": 7},\n  {"prompt": "two"}\n]\n')
    assert [(e.text, e.output_length) for e in load_prompts(array)] == [("one", 7), ("two", None)]
    lines = tmp_path / "lines.json"
    lines.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')  # JSON lines under .json, as before
    assert [e.text for e in load_prompts(lines)] == ["one", "two"]
    array.write_text('[{"prompt": "one"}, {"output_len": 3}]')
    with pytest.raises(WorkloadError, match='item 2: needs a non-empty string "prompt"'):
        load_prompts(array)
    array.write_text("[]")
    with pytest.raises(WorkloadError, match="holds no prompts"):
        load_prompts(array)
    array.write_text('[{"prompt": "one"}')
    with pytest.raises(WorkloadError, match="not JSON"):
        load_prompts(array)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no prompts"),
        ("[1]\n", "non-empty string"),
        ("{x\n", "not JSON"),
        ('{"prompt": "a", "output_len": 0}', "positive"),
    ],
)
def test_prompts_file_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load_prompts(path)


def test_gamma_arrivals_have_the_rate_and_burstiness_asked_for() -> None:
    for burstiness in (0.5, 1.0, 4.0):
        times = list(itertools.islice(arrival_offsets(10.0, burstiness, random.Random(0)), 20000))
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
        cv2 = statistics.pvariance(gaps) / statistics.fmean(gaps) ** 2
        assert cv2 == pytest.approx(1 / burstiness, rel=0.1), "gamma: squared coefficient of variation = 1/shape"
    all_at_once = arrival_offsets(float("inf"), 1.0, random.Random(0))
    assert [next(all_at_once) for _ in range(3)] == [0.0, 0.0, 0.0]


def test_arrivals_do_not_change_the_requests() -> None:
    plain = _first(WorkloadSpec(seed=5), 20)
    timed = _first(WorkloadSpec(seed=5, request_rate=50.0, burstiness=0.5), 20)
    assert [(r.prompt, r.max_tokens) for r in timed] == [(r.prompt, r.max_tokens) for r in plain]
    times = [r.send_at for r in timed]
    assert all(t is not None for t in times) and times == sorted(times)
    assert times == [r.send_at for r in _first(WorkloadSpec(seed=5, request_rate=50.0, burstiness=0.5), 20)]


@pytest.mark.parametrize(
    "options",
    [
        {"output_lengths": Lengths(0, 4)},
        {"request_rate": 0.0},
        {"burstiness": 0.0},
        {"vocab_size": 0},
        {"prefix_groups": -1, "prefix_length": 4},
    ],
)
def test_unusable_settings_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(WorkloadError):
        WorkloadSpec(**options)  # type: ignore[arg-type]
