"""Bounds on client-sized fields: pure checks, and discovery narrowed to them."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.bounds import (
    FieldBounds,
    advertise_bounds,
    check_abort_fields,
    check_generate_fields,
    check_lora_fields,
    check_task_fields,
)
from openengine_gateway.errors import InvalidArgument

TIGHT = FieldBounds(max_id_chars=4, max_metadata_entries=1, max_path_chars=8)


def test_a_generous_request_passes_the_default_bounds() -> None:
    request = pb.GenerateRequest(request_id="r" * 1024, model="m", prompt="p" * 100_000, metadata={"trace": "t" * 1024})
    request.stopping.conditions.extend(pb.StopCondition(stop_text="x" * 100) for _ in range(1024))
    request.guided.json_schema = "{" + " " * 100_000 + "}"
    check_generate_fields(request, FieldBounds())


def test_advertise_bounds_narrows_or_sets_max_num_sequences_and_leaves_non_generating_models() -> None:
    reported, unreported, pooling = pb.ModelInfo(), pb.ModelInfo(), pb.ModelInfo()
    reported.generation.max_num_sequences = 500
    unreported.generation.SetInParent()
    for info in (reported, unreported, pooling):
        advertise_bounds(info, FieldBounds(max_num_sequences=16))
    assert reported.generation.max_num_sequences == unreported.generation.max_num_sequences == 16
    assert not pooling.HasField("generation")
    small = pb.ModelInfo()
    small.generation.max_num_sequences = 4
    advertise_bounds(small, FieldBounds(max_num_sequences=16))
    assert small.generation.max_num_sequences == 4


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_abort_fields(pb.AbortRequest(request_id="12345"), TIGHT),
        lambda: check_abort_fields(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="12345")), TIGHT),
        lambda: check_lora_fields("12345", "", TIGHT),
        lambda: check_lora_fields("a", "/" + "p" * 8, TIGHT),
        lambda: check_task_fields(pb.EmbedRequest(context=pb.TaskRequestContext(metadata={"a": "1", "b": "2"})), TIGHT),
        lambda: check_task_fields(
            pb.ScoreRequest(groups=[pb.ScoreGroup(group_id="g", candidates=[pb.TaskInput(item_id="12345")])]), TIGHT
        ),
        lambda: check_generate_fields(pb.GenerateRequest(metadata={"k": "12345"}), TIGHT),
    ],
)
def test_one_past_a_bound_is_invalid_argument_naming_its_flag(check: object) -> None:
    with pytest.raises(InvalidArgument, match=r"this gateway accepts at most \d+ \(--max-"):
        check()  # type: ignore[operator]
