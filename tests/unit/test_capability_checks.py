"""``contract.capabilities.check_model_info``: the advertised table itself obeys the contract."""

from __future__ import annotations

from typing import Any

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.capabilities import check_model_info
from openengine_gateway.errors import CapabilityError

LIMITS = (
    "max_context_length",
    "max_output_tokens",
    "kv_block_size",
    "total_kv_blocks",
    "max_running_requests",
    "max_batched_tokens",
)

FULL = pb.ModelInfo(
    max_context_length=4096,
    max_output_tokens=1024,
    kv_block_size=16,
    total_kv_blocks=100,
    max_running_requests=8,
    max_batched_tokens=2048,
    supports_text_input=False,
    supports_lora=False,
    generation=pb.GenerationCapabilities(
        prompt_logprobs=pb.LogprobCapabilities(supported=True, candidate_selection_modes=[1, 2, 3], max_top_n=5),
        output_logprobs=pb.LogprobCapabilities(supported=False),
        guided_decoding=pb.GuidedDecodingCapabilities(supported=True, modes=[1, 6]),
        max_num_sequences=2,
        supports_priority=False,
    ),
    tasks=pb.TaskCapabilities(
        embed=pb.EmbedCapabilities(
            supported=True,
            input_types=[pb.TASK_INPUT_TYPE_MULTIMODAL],
            granularities=[1],
            encodings=[1, 2],
            dimension=8,
            max_batch_size=4,
            max_output_values_per_item=64,
            modalities=[pb.MODALITY_IMAGE],
        ),
        classify=pb.ClassifyCapabilities(supported=False, semantics=[1], max_output_values_per_item=1),
        score=pb.ScoreCapabilities(
            supported=True,
            normalizations=[1, 2],
            max_groups=1,
            max_candidates_per_group=1,
            max_output_values_per_candidate=1,
            max_label_token_ids=1,
        ),
    ),
)


def test_a_correct_table_passes() -> None:
    check_model_info(FULL)
    check_model_info(pb.ModelInfo())  # nothing reported is valid too


def with_(**fields: Any) -> pb.ModelInfo:
    info = pb.ModelInfo()
    info.CopyFrom(FULL)
    for path, value in fields.items():
        *parents, name = path.split("__")
        target: Any = info
        for parent in parents:
            target = getattr(target, parent)
        if isinstance(value, list):
            del getattr(target, name)[:]
            getattr(target, name).extend(value)
        else:
            setattr(target, name, value)
    return info


@pytest.mark.parametrize("name", LIMITS)
def test_reported_limits_are_positive(name: str) -> None:
    with pytest.raises(CapabilityError, match=rf"ModelInfo\.{name} is reported as 0"):
        check_model_info(with_(**{name: 0}))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            {"generation__prompt_logprobs__candidate_selection_modes": [1, 0]},
            "prompt_logprobs.candidate_selection_modes",
        ),
        ({"generation__output_logprobs__candidate_selection_modes": [0]}, "output_logprobs.candidate_selection_modes"),
        ({"generation__prompt_logprobs__max_top_n": 0}, "prompt_logprobs.max_top_n"),
        ({"generation__guided_decoding__modes": [0]}, "guided_decoding.modes"),
        ({"generation__max_num_sequences": 0}, "generation.max_num_sequences"),
        ({"tasks__embed__input_types": [0, 3]}, "tasks.embed.input_types"),
        ({"tasks__embed__granularities": [0]}, "tasks.embed.granularities"),
        ({"tasks__embed__encodings": [0]}, "tasks.embed.encodings"),
        ({"tasks__embed__modalities": [0]}, "tasks.embed.modalities"),
        ({"tasks__classify__semantics": [0]}, "tasks.classify.semantics"),
        ({"tasks__score__normalizations": [0]}, "tasks.score.normalizations"),
        ({"tasks__embed__dimension": 0}, "tasks.embed.dimension"),
        ({"tasks__embed__max_batch_size": 0}, "tasks.embed.max_batch_size"),
        ({"tasks__embed__max_output_values_per_item": 0}, "tasks.embed.max_output_values_per_item"),
        ({"tasks__classify__max_output_values_per_item": 0}, "tasks.classify.max_output_values_per_item"),
        ({"tasks__score__max_groups": 0}, "tasks.score.max_groups"),
        ({"tasks__score__max_candidates_per_group": 0}, "tasks.score.max_candidates_per_group"),
        ({"tasks__score__max_output_values_per_candidate": 0}, "tasks.score.max_output_values_per_candidate"),
        ({"tasks__score__max_label_token_ids": 0}, "tasks.score.max_label_token_ids"),
    ],
)
def test_violations_name_the_field(change: dict[str, Any], where: str) -> None:
    with pytest.raises(CapabilityError, match=where.replace(".", r"\.")):
        check_model_info(with_(**change))


def test_modalities_only_with_multimodal_input() -> None:
    with pytest.raises(CapabilityError, match=r"tasks\.embed\.modalities is set without TASK_INPUT_TYPE_MULTIMODAL"):
        check_model_info(with_(tasks__embed__input_types=[pb.TASK_INPUT_TYPE_TEXT]))
    with pytest.raises(CapabilityError, match=r"tasks\.score\.modalities"):
        check_model_info(with_(tasks__score__modalities=[pb.MODALITY_AUDIO]))


def test_present_false_and_absent_are_both_valid() -> None:
    """Presence is reported as-is: an explicit false or unreported value is never an error."""
    check_model_info(
        pb.ModelInfo(supports_multimodal=False, generation=pb.GenerationCapabilities(supports_cache_salt=False))
    )
