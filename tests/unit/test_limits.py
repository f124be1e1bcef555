"""``contract.limits``: what the operator's caps do to what a model advertises."""

from __future__ import annotations

from openengine_gateway import pb
from openengine_gateway.contract.limits import RequestLimits, advertise_task_limits


def model(**tasks: object) -> pb.ModelInfo:
    return pb.ModelInfo(tasks=pb.TaskCapabilities(**tasks))  # type: ignore[arg-type]


def test_batch_limits_narrow_to_the_gateway_s_but_never_widen() -> None:
    info = model(
        embed=pb.EmbedCapabilities(supported=True, max_batch_size=3),
        classify=pb.ClassifyCapabilities(supported=True),
        score=pb.ScoreCapabilities(supported=True, max_groups=2, max_candidates_per_group=50),
    )
    advertise_task_limits(info, RequestLimits(max_task_items=8))
    assert (info.tasks.embed.max_batch_size, info.tasks.classify.max_batch_size) == (3, 8)
    assert (info.tasks.score.max_groups, info.tasks.score.max_candidates_per_group) == (2, 7)


def test_unsupported_tasks_and_no_cap_are_left_alone() -> None:
    info = model(embed=pb.EmbedCapabilities(supported=False), score=pb.ScoreCapabilities(supported=True))
    advertise_task_limits(info, RequestLimits())
    assert info == model(embed=pb.EmbedCapabilities(supported=False), score=pb.ScoreCapabilities(supported=True))
    advertise_task_limits(info, RequestLimits(max_task_items=4))
    assert not info.tasks.embed.HasField("max_batch_size") and not info.tasks.HasField("classify")
    generation_only = pb.ModelInfo()
    advertise_task_limits(generation_only, RequestLimits(max_task_items=4))
    assert not generation_only.HasField("tasks")


def test_one_item_leaves_score_as_reported() -> None:
    """A Score group needs two inputs: no limit above zero describes what one item admits."""
    info = model(score=pb.ScoreCapabilities(supported=True, max_groups=4))
    advertise_task_limits(info, RequestLimits(max_task_items=1))
    assert info.tasks.score.max_groups == 4 and not info.tasks.score.HasField("max_candidates_per_group")
