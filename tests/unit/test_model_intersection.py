"""A split's ModelInfo: what every engine behind the name accepts, and the token ids a request sends."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb
from openengine_gateway.contract.capabilities import check_model_info
from openengine_gateway.contract.intersection import (
    RULES,
    TOKEN_ID_CAPABILITIES,
    Rule,
    intersect_model_info,
    token_id_fields,
)

TOKEN_IDS_MODE = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS


def leaves(descriptor: Descriptor, prefix: str = "") -> dict[str, FieldDescriptor]:
    """Every non-message field under ``descriptor``, by dotted path (submessages walked)."""
    found: dict[str, FieldDescriptor] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            found.update(leaves(field.message_type, f"{prefix}{field.name}."))
        else:
            found[prefix + field.name] = field
    return found


FIELDS = leaves(pb.ModelInfo.DESCRIPTOR)


def both(first: pb.ModelInfo, second: pb.ModelInfo, *, same_tokenizer: bool = True) -> pb.ModelInfo:
    result = intersect_model_info([first, second], same_tokenizer=same_tokenizer)
    check_model_info(result)
    return result


# -- the table ----------------------------------------------------------------------------


def test_every_field_of_model_info_has_a_rule() -> None:
    """A new proto field fails here until someone decides how a split combines it."""
    assert sorted(set(FIELDS) - set(RULES)) == [], "fields without a rule"
    assert sorted(set(RULES) - set(FIELDS)) == [], "rules for fields that are gone"


def test_lists_are_shared_and_only_lists_are() -> None:
    for path, rule in RULES.items():
        if rule is not Rule.CALLER:
            assert (rule is Rule.SHARED) == FIELDS[path].is_repeated, path
        if rule in (Rule.SMALLEST, Rule.CAPACITY, Rule.COMMON, Rule.ALL):
            assert FIELDS[path].has_presence or FIELDS[path].type == FieldDescriptor.TYPE_STRING, path
        if rule is Rule.ALL:
            assert FIELDS[path].type == FieldDescriptor.TYPE_BOOL, path


def test_every_token_id_capability_is_withdrawn() -> None:
    """A field named for token ids, and every list that can hold a token-ids entry, is in the table."""
    for path, field in FIELDS.items():
        token_entries = [
            value.number
            for value in (field.enum_type.values if field.enum_type is not None else ())
            if value.name.endswith("_TOKEN_IDS")
        ]
        if token_entries:
            assert [TOKEN_ID_CAPABILITIES.get(path)] == token_entries, path
        elif "token_id" in field.name or "label_token" in field.name:
            assert path in TOKEN_ID_CAPABILITIES and TOKEN_ID_CAPABILITIES[path] is None, path
    assert set(TOKEN_ID_CAPABILITIES) <= set(FIELDS)


# -- the rules ----------------------------------------------------------------------------


def test_limits_are_the_smallest_reported() -> None:
    a = pb.ModelInfo(max_context_length=4096, max_output_tokens=100, total_kv_blocks=10)
    a.generation.output_logprobs.max_top_n = 5
    a.tasks.score.max_groups = 8
    b = pb.ModelInfo(max_context_length=2048, max_output_tokens=200, max_batched_tokens=64)
    b.generation.output_logprobs.max_top_n = 20
    b.generation.max_num_sequences = 4
    result = both(a, b)
    assert (result.max_context_length, result.max_output_tokens) == (2048, 100)
    assert result.generation.output_logprobs.max_top_n == 5 and result.generation.max_num_sequences == 4
    assert result.tasks.score.max_groups == 8
    assert not result.generation.prompt_logprobs.HasField("max_top_n")


CAPACITIES = ["kv_block_size", "total_kv_blocks", "max_running_requests", "max_batched_tokens"]


@pytest.mark.parametrize("name", CAPACITIES)
def test_a_capacity_is_absent_unless_every_engine_reports_it(name: str) -> None:
    reported, unreported = pb.ModelInfo(**{name: 16}), pb.ModelInfo()
    assert not both(reported, unreported).HasField(name), "one engine's capacity is not the split's"
    assert not both(unreported, reported).HasField(name)
    assert getattr(both(reported, pb.ModelInfo(**{name: 16})), name) == 16


@pytest.mark.parametrize("name", CAPACITIES[1:])
def test_a_capacity_every_engine_reports_is_the_smallest(name: str) -> None:
    assert getattr(both(pb.ModelInfo(**{name: 64}), pb.ModelInfo(**{name: 8})), name) == 8


def test_other_values_only_when_every_engine_agrees() -> None:
    a = pb.ModelInfo(model_id="m", kv_block_size=16, reasoning_parser="r", tool_call_parser="t1")
    a.tasks.embed.dimension = 64
    a.tasks.score.higher_is_better = False
    b = pb.ModelInfo(model_id="m", kv_block_size=16, reasoning_parser="r", tool_call_parser="t2")
    b.tasks.embed.dimension = 32
    b.tasks.score.higher_is_better = False
    result = both(a, b)
    assert (result.model_id, result.kv_block_size, result.reasoning_parser) == ("m", 16, "r")
    assert result.tool_call_parser == ""
    assert not result.tasks.embed.HasField("dimension")
    assert result.tasks.score.HasField("higher_is_better") and not result.tasks.score.higher_is_better
    c = pb.ModelInfo(model_id="other")
    result = both(a, c)
    assert result.model_id == "" and not result.HasField("kv_block_size"), "unreported is not agreement"


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [(True, True, True), (True, False, False), (None, False, False), (True, None, None), (None, None, None)],
)
def test_support_is_false_if_any_denies_and_true_only_if_all_confirm(
    first: bool | None, second: bool | None, expected: bool | None
) -> None:
    a, b = pb.ModelInfo(), pb.ModelInfo()
    for info, value in ((a, first), (b, second)):
        if value is not None:
            info.supports_lora = value
            info.generation.guided_decoding.supported = value
            info.tasks.classify.supports_priority = value
    result = both(a, b)
    for message, name in (
        (result, "supports_lora"),
        (result.generation.guided_decoding, "supported"),
        (result.tasks.classify, "supports_priority"),
    ):
        assert (getattr(message, name) if message.HasField(name) else None) is expected, name


def test_lists_keep_what_all_share_in_the_first_engine_s_order() -> None:
    a = pb.ModelInfo(tokenizer_modes=["slow", "auto", "mistral"])
    a.generation.guided_decoding.modes[:] = [pb.GUIDED_DECODING_MODE_CHOICE, pb.GUIDED_DECODING_MODE_REGEX]
    a.tasks.embed.input_types[:] = [pb.TASK_INPUT_TYPE_MULTIMODAL, pb.TASK_INPUT_TYPE_TEXT]
    a.tasks.embed.modalities[:] = [pb.MODALITY_AUDIO, pb.MODALITY_IMAGE]
    b = pb.ModelInfo(tokenizer_modes=["mistral", "auto"])
    b.generation.guided_decoding.modes[:] = [pb.GUIDED_DECODING_MODE_REGEX, pb.GUIDED_DECODING_MODE_JSON_SCHEMA]
    b.tasks.embed.input_types[:] = [pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_MULTIMODAL]
    b.tasks.embed.modalities[:] = [pb.MODALITY_IMAGE]
    result = both(a, b)
    assert list(result.tokenizer_modes) == ["auto", "mistral"]
    assert list(result.generation.guided_decoding.modes) == [pb.GUIDED_DECODING_MODE_REGEX]
    assert list(result.tasks.embed.input_types) == [pb.TASK_INPUT_TYPE_MULTIMODAL, pb.TASK_INPUT_TYPE_TEXT]
    assert list(result.tasks.embed.modalities) == [pb.MODALITY_IMAGE]


def test_a_submessage_one_engine_lacks_reads_as_unreported() -> None:
    a = pb.ModelInfo()
    a.tasks.embed.CopyFrom(
        pb.EmbedCapabilities(supported=True, input_types=[pb.TASK_INPUT_TYPE_TEXT], dimension=8, max_batch_size=4)
    )
    result = both(a, pb.ModelInfo())
    embed = result.tasks.embed
    assert result.tasks.HasField("embed") and not result.tasks.HasField("score")
    assert not embed.HasField("supported"), "one engine does not say it embeds"
    assert list(embed.input_types) == [] and not embed.HasField("dimension") and embed.max_batch_size == 4
    assert not result.HasField("generation"), "a submessage no engine has stays absent"


def test_one_engine_gives_a_copy_and_no_input_changes() -> None:
    info = pb.ModelInfo(model_id="m", max_context_length=8, tokenizer_modes=["auto"], supports_token_ids_input=True)
    info.generation.output_logprobs.candidate_selection_modes[:] = [TOKEN_IDS_MODE]
    info.tasks.score.SetInParent()
    other = pb.ModelInfo(max_context_length=4)
    before = [pb.ModelInfo.FromString(m.SerializeToString()) for m in (info, other)]
    assert intersect_model_info([info], same_tokenizer=False) == info
    both(info, other, same_tokenizer=False)
    assert [info, other] == before


def test_the_served_names_are_left_to_the_caller() -> None:
    info = pb.ModelInfo(served_model_name="a", served_model_aliases=["b"], max_context_length=8)
    for infos in ([info], [info, info]):
        result = intersect_model_info(infos, same_tokenizer=True)
        assert result.served_model_name == "" and list(result.served_model_aliases) == []
        assert result.max_context_length == 8


def test_no_engine_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="at least one"):
        intersect_model_info([], same_tokenizer=True)


def token_id_engine() -> pb.ModelInfo:
    info = pb.ModelInfo(supports_text_input=True, supports_token_ids_input=True)
    modes = [pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, TOKEN_IDS_MODE, pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL]
    for side in (info.generation.prompt_logprobs, info.generation.output_logprobs):
        side.CopyFrom(pb.LogprobCapabilities(supported=True, candidate_selection_modes=modes, max_top_n=5))
    types = [pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_TOKEN_IDS]
    info.tasks.embed.input_types[:] = types
    info.tasks.classify.input_types[:] = types
    info.tasks.score.CopyFrom(
        pb.ScoreCapabilities(
            supported=True, input_types=types, supports_label_token_scoring=True, max_label_token_ids=10
        )
    )
    return info


def test_different_tokenizers_withdraw_every_token_id_capability() -> None:
    same = both(token_id_engine(), token_id_engine())
    assert same == token_id_engine(), "one tokenizer: token ids stay"
    result = both(token_id_engine(), token_id_engine(), same_tokenizer=False)
    assert result.HasField("supports_token_ids_input") and not result.supports_token_ids_input
    assert result.supports_text_input
    for side in (result.generation.prompt_logprobs, result.generation.output_logprobs):
        assert list(side.candidate_selection_modes) == [
            pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
            pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
        ]
        assert side.supported and side.max_top_n == 5
    for task in (result.tasks.embed, result.tasks.classify, result.tasks.score):
        assert list(task.input_types) == [pb.TASK_INPUT_TYPE_TEXT]
    score = result.tasks.score
    assert score.HasField("supports_label_token_scoring") and not score.supports_label_token_scoring
    assert not score.HasField("max_label_token_ids") and score.supported


def test_withdrawing_adds_no_submessage() -> None:
    result = both(pb.ModelInfo(max_context_length=8), pb.ModelInfo(), same_tokenizer=False)
    assert result == pb.ModelInfo(max_context_length=8, supports_token_ids_input=False)


async def test_two_differently_configured_mocks() -> None:
    """The mock's real table beside one with less of everything."""
    narrow = MockSettings(
        seed=1,
        max_context_length=1024,
        max_output_tokens=512,
        max_top_n=5,
        kv_block_size=32,
        guided_decoding_modes=("regex",),
        enable_prompt_logprobs=False,
        enable_lora=False,
        enable_classify=False,
        enable_multimodal=True,
        embedding_dimension=32,
        max_task_batch_size=16,
    )
    facts = []
    for settings in (MockSettings(), narrow):
        backend = MockBackend(settings)
        facts.append(await backend.start())
        await backend.stop()
    wide_info, narrow_info = (f.model for f in facts)
    assert facts[0].tokenizer_id is not None and facts[0].tokenizer_id == facts[1].tokenizer_id
    result = both(wide_info, narrow_info)
    assert (result.model_id, result.max_context_length, result.max_output_tokens) == ("mock-model", 1024, 512)
    assert not result.HasField("kv_block_size")
    generation = result.generation
    assert not generation.prompt_logprobs.supported and list(generation.prompt_logprobs.candidate_selection_modes) == []
    assert generation.output_logprobs.max_top_n == 5
    assert list(generation.guided_decoding.modes) == [pb.GUIDED_DECODING_MODE_REGEX]
    assert not result.supports_lora and not result.supports_multimodal and result.supports_token_ids_input
    tasks = result.tasks
    assert tasks.embed.supported and not tasks.embed.HasField("dimension") and tasks.embed.max_batch_size == 16
    assert not tasks.embed.supports_lora and list(tasks.embed.modalities) == []
    assert list(tasks.embed.input_types) == [pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_TOKEN_IDS]
    assert tasks.classify.HasField("supported") and not tasks.classify.supported
    assert tasks.score.higher_is_better and tasks.score.supports_label_token_scoring
    split = both(wide_info, narrow_info, same_tokenizer=False)
    assert not split.supports_token_ids_input and not split.tasks.score.supports_label_token_scoring
    assert TOKEN_IDS_MODE not in split.generation.output_logprobs.candidate_selection_modes
    assert list(split.tasks.embed.input_types) == [pb.TASK_INPUT_TYPE_TEXT]


# -- token ids in requests ------------------------------------------------------------------


def test_a_text_request_carries_no_token_ids() -> None:
    request = pb.GenerateRequest(
        request_id="r",
        prompt="hi",
        stopping=pb.StoppingOptions(conditions=[pb.StopCondition(stop_text="x")]),
        response=pb.ResponseOptions(output_candidates=pb.CandidateTokenSelection(top_n=2)),
        media=[pb.MediaItem(url="http://x")],
        metadata={"token_ids": "1"},
    )
    assert token_id_fields(request) == []
    assert token_id_fields(pb.EmbedRequest(inputs=[pb.TaskInput(text="a")])) == []


def test_generate_request_token_ids() -> None:
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2]),
        stopping=pb.StoppingOptions(conditions=[pb.StopCondition(stop_text="x"), pb.StopCondition(stop_token_id=0)]),
        response=pb.ResponseOptions(
            prompt_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[3])),
            output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[4])),
        ),
    )
    assert token_id_fields(request) == [
        "token_ids",
        "stopping.conditions.stop_token_id",
        "response.prompt_candidates.token_ids",
        "response.output_candidates.token_ids",
    ]


def test_task_request_token_ids_are_named_once() -> None:
    inputs = [
        pb.TaskInput(token_ids=pb.TokenIds(ids=[1])),
        pb.TaskInput(token_ids=pb.TokenIds(ids=[2])),
        pb.TaskInput(multimodal=pb.MultimodalTaskInput(token_ids=pb.TokenIds(ids=[3]))),
        pb.TaskInput(multimodal=pb.MultimodalTaskInput(text="t")),
    ]
    expected = ["inputs.token_ids", "inputs.multimodal.token_ids"]
    assert token_id_fields(pb.EmbedRequest(inputs=inputs)) == expected
    assert token_id_fields(pb.ClassifyRequest(inputs=inputs)) == expected
    score = pb.ScoreRequest(
        groups=[
            pb.ScoreGroup(
                query=pb.TaskInput(token_ids=pb.TokenIds(ids=[1])),
                candidates=[pb.TaskInput(text="a"), pb.TaskInput(multimodal=pb.MultimodalTaskInput(token_ids={}))],
            )
        ],
        options=pb.ScoreOptions(label_token_ids=[5, 6]),
    )
    assert token_id_fields(score) == [
        "groups.query.token_ids",
        "groups.candidates.multimodal.token_ids",
        "options.label_token_ids",
    ]
    text_score = pb.ScoreRequest(groups=[pb.ScoreGroup(query=pb.TaskInput(text="q"))], options=pb.ScoreOptions())
    assert token_id_fields(text_score) == []
