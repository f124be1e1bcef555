"""``contract.tasks``: Embed, Classify and Score validation and response invariants."""

from __future__ import annotations

import math
from typing import Any

import pytest
from openengine_gateway import pb
from openengine_gateway.contract import tasks as rules
from openengine_gateway.contract.stream import ContractViolation
from openengine_gateway.errors import FailedPrecondition, InvalidArgument
from openengine_gateway.spi import Media, TaskContext, TaskItem

SEQ = pb.TASK_OUTPUT_GRANULARITY_SEQUENCE
TOK = pb.TASK_OUTPUT_GRANULARITY_TOKEN
LOGITS = pb.TASK_VALUE_SEMANTICS_LOGITS
PROBS = pb.TASK_VALUE_SEMANTICS_PROBABILITIES
RELEVANCE = pb.TASK_VALUE_SEMANTICS_RELEVANCE
DENSE = pb.EMBEDDING_ENCODING_DENSE
SPARSE = pb.EMBEDDING_ENCODING_SPARSE
TEXT = pb.TASK_INPUT_TYPE_TEXT
IDS = pb.TASK_INPUT_TYPE_TOKEN_IDS
MULTIMODAL = pb.TASK_INPUT_TYPE_MULTIMODAL

EMBED = pb.EmbedCapabilities(
    supported=True,
    input_types=[TEXT, IDS, MULTIMODAL],
    granularities=[SEQ, TOK],
    encodings=[DENSE, SPARSE],
    dimension=8,
    max_batch_size=3,
    max_output_values_per_item=64,
    supports_priority=True,
    supports_lora=True,
    supports_normalization=True,
    supports_dimension_override=True,
    modalities=[pb.MODALITY_IMAGE],
)
CLASSIFY = pb.ClassifyCapabilities(supported=True, granularities=[SEQ, TOK], semantics=[LOGITS, PROBS])
SCORE = pb.ScoreCapabilities(
    supported=True,
    input_types=[TEXT, IDS],
    granularities=[SEQ],
    semantics=[RELEVANCE],
    normalizations=[pb.SCORE_NORMALIZATION_NONE],
    supports_label_token_scoring=True,
    supports_instruction=True,
    max_groups=2,
    max_candidates_per_group=3,
    max_label_token_ids=2,
    higher_is_better=True,
)
MODEL = pb.ModelInfo(served_model_name="m", tasks=pb.TaskCapabilities(embed=EMBED, classify=CLASSIFY, score=SCORE))
CONTEXT = pb.TaskRequestContext(request_id="r", model="m")


def text(item_id: str, value: str = "hello") -> pb.TaskInput:
    return pb.TaskInput(item_id=item_id, text=value)


def embed_request(*inputs: pb.TaskInput, **options: Any) -> pb.EmbedRequest:
    return pb.EmbedRequest(context=CONTEXT, inputs=inputs or [text("a")], options=pb.EmbedOptions(**options))


def classify_request(*inputs: pb.TaskInput, **options: Any) -> pb.ClassifyRequest:
    return pb.ClassifyRequest(context=CONTEXT, inputs=inputs or [text("a")], options=pb.ClassifyOptions(**options))


def group(group_id: str = "g", query: str = "q", *candidates: str) -> pb.ScoreGroup:
    return pb.ScoreGroup(group_id=group_id, query=text(query), candidates=[text(c) for c in candidates or ("c1",)])


def score_request(*groups: pb.ScoreGroup, **options: Any) -> pb.ScoreRequest:
    return pb.ScoreRequest(context=CONTEXT, groups=groups or [group()], options=pb.ScoreOptions(**options))


def with_tasks(**tasks: Any) -> pb.ModelInfo:
    return pb.ModelInfo(served_model_name="m", tasks=pb.TaskCapabilities(**tasks))


# -- capability and context ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        pb.ModelInfo(),
        with_tasks(),
        with_tasks(embed=pb.EmbedCapabilities()),
        with_tasks(embed=pb.EmbedCapabilities(supported=False)),
        with_tasks(classify=CLASSIFY),
    ],
    ids=["no-tasks", "no-embed", "support-unreported", "unsupported", "other-task"],
)
def test_unadvertised_task_is_failed_precondition(model: pb.ModelInfo) -> None:
    with pytest.raises(FailedPrecondition, match="does not support Embed"):
        rules.parse_embed(embed_request(), model)


def test_require_context() -> None:
    rules.require_context(CONTEXT)
    with pytest.raises(InvalidArgument, match="request_id"):
        rules.require_context(pb.TaskRequestContext(model="m"))
    with pytest.raises(InvalidArgument, match="model"):
        rules.require_context(pb.TaskRequestContext(request_id="r"))


def test_context_options_follow_the_task_capabilities() -> None:
    context = pb.TaskRequestContext(request_id="r", model="m", lora_name="l", priority=0, metadata={"k": "v"})
    assert rules.parse_context(context, EMBED) == TaskContext("r", "m", "l", 0, {"k": "v"})
    with pytest.raises(InvalidArgument, match="LoRA"):
        rules.parse_context(pb.TaskRequestContext(lora_name="l"), CLASSIFY)
    with pytest.raises(InvalidArgument, match="priority"):
        rules.parse_context(pb.TaskRequestContext(priority=1), CLASSIFY)
    assert rules.parse_context(CONTEXT, CLASSIFY) == TaskContext("r", "m")


# -- inputs ---------------------------------------------------------------------------------------


def test_items_of_every_kind() -> None:
    media = [pb.MediaItem(url="https://x/cat.png")]
    call = rules.parse_embed(
        embed_request(
            text("t"),
            pb.TaskInput(item_id="i", token_ids=pb.TokenIds(ids=[1, 2])),
            pb.TaskInput(item_id="m", multimodal=pb.MultimodalTaskInput(text="what", media=media)),
        ),
        MODEL,
    )
    image = Media(pb.MODALITY_IMAGE, url="https://x/cat.png")
    assert call.items == (
        TaskItem("t", text="hello"),
        TaskItem("i", token_ids=[1, 2]),
        TaskItem("m", text="what", media=(image,)),
    )
    assert [item.input_type for item in call.items] == [TEXT, IDS, MULTIMODAL]


def test_multimodal_prompt_variants() -> None:
    media = [pb.MediaItem(raw_bytes=b"\x89")]
    ids = pb.TaskInput(item_id="a", multimodal=pb.MultimodalTaskInput(token_ids=pb.TokenIds(ids=[3]), media=media))
    bare = pb.TaskInput(item_id="b", multimodal=pb.MultimodalTaskInput(media=media))
    first, second = rules.parse_embed(embed_request(ids, bare), MODEL).items
    assert first.token_ids == [3] and first.text is None and len(first.media) == 1
    assert second.text is None and second.token_ids is None and second.input_type == MULTIMODAL


@pytest.mark.parametrize(
    ("item", "match"),
    [
        (pb.TaskInput(text="x"), r"inputs\[0\].item_id is required"),
        (pb.TaskInput(item_id="a"), "sets no input"),
        (pb.TaskInput(item_id="a", text=""), "text must be non-empty"),
        (pb.TaskInput(item_id="a", token_ids=pb.TokenIds()), "token_ids must be non-empty"),
        (pb.TaskInput(item_id="a", multimodal=pb.MultimodalTaskInput(text="x")), "at least one media"),
        (
            pb.TaskInput(item_id="a", multimodal=pb.MultimodalTaskInput(media=[pb.MediaItem()])),
            "sets no source",
        ),
        (
            pb.TaskInput(
                item_id="a",
                multimodal=pb.MultimodalTaskInput(media=[pb.MediaItem(modality=pb.MODALITY_AUDIO, url="http://x")]),
            ),
            "MODALITY_AUDIO is not advertised",
        ),
        (
            pb.TaskInput(item_id="a", multimodal=pb.MultimodalTaskInput(text="", media=[pb.MediaItem(url="http://x")])),
            "text must be non-empty",
        ),
    ],
)
def test_item_rejections(item: pb.TaskInput, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        rules.parse_embed(embed_request(item), MODEL)


def test_batch_must_be_non_empty_and_within_the_limit() -> None:
    with pytest.raises(InvalidArgument, match="inputs must be non-empty"):
        rules.parse_embed(pb.EmbedRequest(context=CONTEXT), MODEL)
    with pytest.raises(InvalidArgument, match="max_batch_size"):
        rules.parse_embed(embed_request(text("a"), text("b"), text("c"), text("d")), MODEL)
    assert len(rules.parse_embed(embed_request(text("a"), text("b"), text("c")), MODEL).items) == 3


def test_item_ids_are_unique_in_a_batch() -> None:
    with pytest.raises(InvalidArgument, match="duplicate item_id 'a'"):
        rules.parse_classify(classify_request(text("a"), text("b"), text("a")), MODEL)


def test_input_types_must_be_advertised() -> None:
    text_only = with_tasks(classify=pb.ClassifyCapabilities(supported=True, input_types=[TEXT]))
    with pytest.raises(InvalidArgument, match="TASK_INPUT_TYPE_TOKEN_IDS is not advertised"):
        rules.parse_classify(classify_request(pb.TaskInput(item_id="a", token_ids=pb.TokenIds(ids=[1]))), text_only)
    with pytest.raises(InvalidArgument, match="TASK_INPUT_TYPE_MULTIMODAL is not advertised"):
        rules.parse_classify(
            classify_request(
                pb.TaskInput(item_id="a", multimodal=pb.MultimodalTaskInput(media=[pb.MediaItem(url="http://x")]))
            ),
            text_only,
        )


# -- embed options --------------------------------------------------------------------------------


def test_absent_embed_options_select_defaults() -> None:
    call = rules.parse_embed(embed_request(), MODEL)
    assert (call.granularity, call.normalize, call.dimensions, call.encoding) == (None, None, None, None)
    assert call.context == TaskContext("r", "m")


def test_explicit_embed_options() -> None:
    call = rules.parse_embed(embed_request(granularity=TOK, normalize=False, dimensions=8, encoding=SPARSE), MODEL)
    assert (call.granularity, call.normalize, call.dimensions, call.encoding) == (TOK, False, 8, SPARSE)
    # An explicit UNSPECIFIED is the default, not a request.
    call = rules.parse_embed(
        embed_request(granularity=0, encoding=0), with_tasks(embed=pb.EmbedCapabilities(supported=True))
    )
    assert call.granularity is None and call.encoding is None


@pytest.mark.parametrize(
    ("caps", "options", "match"),
    [
        (pb.EmbedCapabilities(supported=True, granularities=[SEQ]), {"granularity": TOK}, "GRANULARITY_TOKEN is"),
        (pb.EmbedCapabilities(supported=True), {"granularity": SEQ}, "GRANULARITY_SEQUENCE is"),
        (pb.EmbedCapabilities(supported=True, encodings=[DENSE]), {"encoding": SPARSE}, "EMBEDDING_ENCODING_SPARSE is"),
        (pb.EmbedCapabilities(supported=True), {"normalize": True}, "normalization"),
        (pb.EmbedCapabilities(supported=True, supports_normalization=False), {"normalize": False}, "normalization"),
        (EMBED, {"dimensions": 0}, "greater than zero"),
        (EMBED, {"dimensions": 9}, "reduces, never pads"),
        (pb.EmbedCapabilities(supported=True, dimension=8), {"dimensions": 4}, "dimensions override"),
    ],
)
def test_embed_option_rejections(caps: pb.EmbedCapabilities, options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        rules.parse_embed(embed_request(**options), with_tasks(embed=caps))


def test_an_unknown_enum_value_is_named_by_its_number() -> None:
    with pytest.raises(InvalidArgument, match="granularity 99 is not advertised"):
        rules.parse_embed(embed_request(granularity=99), MODEL)


def test_dimensions_without_a_fixed_native_dimension() -> None:
    caps = pb.EmbedCapabilities(supported=True, supports_dimension_override=True)
    assert rules.parse_embed(embed_request(dimensions=4096), with_tasks(embed=caps)).dimensions == 4096


# -- classify options -----------------------------------------------------------------------------


def test_classify_options() -> None:
    call = rules.parse_classify(classify_request(granularity=TOK, output_semantics=PROBS), MODEL)
    assert (call.granularity, call.semantics) == (TOK, PROBS)
    with pytest.raises(InvalidArgument, match="output_semantics TASK_VALUE_SEMANTICS_LOG_PROBABILITIES is"):
        rules.parse_classify(classify_request(output_semantics=pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES), MODEL)
    assert rules.parse_classify(classify_request(), MODEL).semantics is None


# -- score ------------------------------------------------------------------------------------------


def test_score_call() -> None:
    call = rules.parse_score(
        score_request(group("g1", "q", "a", "b"), group("g2", "q", "a"), label_token_ids=[9, 3], instruction="judge"),
        MODEL,
    )
    assert [(g.group_id, g.query.item_id, [c.item_id for c in g.candidates]) for g in call.groups] == [
        ("g1", "q", ["a", "b"]),
        ("g2", "q", ["a"]),
    ]
    assert call.label_token_ids == (9, 3) and call.instruction == "judge"
    assert call.normalization == pb.SCORE_NORMALIZATION_UNSPECIFIED


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (pb.ScoreRequest(context=CONTEXT), "groups must be non-empty"),
        (score_request(group("a"), group("b"), group("c")), "max_groups"),
        (score_request(pb.ScoreGroup(query=text("q"), candidates=[text("c")])), "group_id is required"),
        (score_request(pb.ScoreGroup(group_id="g", candidates=[text("c")])), "query is required"),
        (score_request(pb.ScoreGroup(group_id="g", query=text("q"))), "candidates must be non-empty"),
        (score_request(group("g", "q", "a", "b", "c", "d")), "advertised maximum is 3"),
        (score_request(group("g", "q", "a", "a")), "duplicate item_id 'a' in groups"),
        (score_request(group("g", "a", "a")), "duplicate item_id 'a' in groups"),
        (score_request(group("g"), group("g")), "duplicate group_id 'g'"),
        (score_request(pb.ScoreGroup(group_id="g", query=text(""), candidates=[text("c")])), "query.item_id"),
        (score_request(normalization=pb.SCORE_NORMALIZATION_SOFTMAX), "normalization SCORE_NORMALIZATION_SOFTMAX is"),
        (score_request(label_token_ids=[1, 1]), "duplicates"),
        (score_request(label_token_ids=[1, 2, 3]), "exceed the advertised maximum"),
        (score_request(output_semantics=LOGITS), "output_semantics TASK_VALUE_SEMANTICS_LOGITS is"),
        (score_request(granularity=TOK), "granularity TASK_OUTPUT_GRANULARITY_TOKEN is"),
    ],
)
def test_score_rejections(request_: pb.ScoreRequest, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        rules.parse_score(request_, MODEL)


def test_score_options_need_advertised_support() -> None:
    plain = with_tasks(score=pb.ScoreCapabilities(supported=True))
    with pytest.raises(InvalidArgument, match="label-token scoring"):
        rules.parse_score(score_request(label_token_ids=[1]), plain)
    with pytest.raises(InvalidArgument, match="instructions"):
        rules.parse_score(score_request(instruction="x"), plain)
    with pytest.raises(InvalidArgument, match="normalization SCORE_NORMALIZATION_NONE is"):
        rules.parse_score(score_request(normalization=pb.SCORE_NORMALIZATION_NONE), plain)
    assert rules.parse_score(score_request(), plain).label_token_ids == ()


# -- tensors --------------------------------------------------------------------------------------


def dense(shape: list[int], values: list[float] | None = None) -> pb.DenseFloatTensor:
    return pb.DenseFloatTensor(shape=shape, values=values if values is not None else [0.5] * math.prod(shape))


def sparse(shape: list[int], indices: list[int], values: list[float] | None = None) -> pb.SparseFloatTensor:
    return pb.SparseFloatTensor(
        shape=shape, indices=indices, values=values if values is not None else [1.0] * len(indices)
    )


def test_dense_tensor_rules() -> None:
    rules.check_dense(dense([2, 3]), "t")
    rules.check_dense(dense([1]), "t")  # a scalar
    for tensor, match in [
        (dense([]), "positive dimensions"),
        (dense([2, 0], []), "positive dimensions"),
        (pb.DenseFloatTensor(shape=[2, 2], values=[1, 2, 3]), "holds 4 values, got 3"),
        (pb.DenseFloatTensor(shape=[2], values=[1, math.nan]), "finite"),
        (pb.DenseFloatTensor(shape=[1], values=[-math.inf]), "finite"),
    ]:
        with pytest.raises(ContractViolation, match=match):
            rules.check_dense(tensor, "t")
    with pytest.raises(ContractViolation, match="limit 5"):
        rules.check_dense(dense([2, 3]), "t", limit=5)
    rules.check_dense(dense([2, 3]), "t", limit=6)


def test_sparse_tensor_rules() -> None:
    rules.check_sparse(sparse([10], [0, 3, 9]), "t")
    rules.check_sparse(sparse([10], []), "t")
    for tensor, match in [
        (sparse([], []), "positive dimensions"),
        (sparse([10], [1, 2], [1.0]), "2 indices for 1 values"),
        (sparse([10], [3, 3]), "strictly increasing"),
        (sparse([10], [4, 2]), "strictly increasing"),
        (sparse([2, 5], [10]), "below 10"),
        (sparse([10], [1], [math.inf]), "finite"),
    ]:
        with pytest.raises(ContractViolation, match=match):
            rules.check_sparse(tensor, "t")
    with pytest.raises(ContractViolation, match="limit 2"):
        rules.check_sparse(sparse([100], [1, 2, 3]), "t", limit=2)  # nonzero values count, not the shape


# -- embed responses ---------------------------------------------------------------------------------


def embed_call(**options: Any) -> Any:
    return rules.parse_embed(embed_request(text("a"), text("b"), **options), MODEL)


def embedding(**fields: Any) -> pb.EmbeddingOutput:
    fields.setdefault("granularity", SEQ)
    if "sparse" not in fields:
        fields.setdefault("dense", dense([8]))
    return pb.EmbeddingOutput(**fields)


def test_embed_response_gets_ids_and_present_indexes() -> None:
    outputs = [embedding(item_id="engine-made"), embedding()]
    response = rules.finish_embed(embed_call(), outputs, pb.TaskUsage(input_tokens=4, cached_input_tokens=4), EMBED)
    assert response.request_id == "r"
    assert [(o.item_id, o.HasField("input_index"), o.input_index) for o in response.outputs] == [
        ("a", True, 0),
        ("b", True, 1),
    ]
    assert response.usage.input_tokens == 4


def test_token_embeddings_align_with_token_ids() -> None:
    call = embed_call(granularity=TOK)
    good = [
        embedding(granularity=TOK, dense=dense([2, 8]), token_ids=[5, 6]),
        embedding(granularity=TOK, dense=dense([1, 8])),
    ]
    rules.finish_embed(call, good, pb.TaskUsage(), EMBED)
    bad = [
        embedding(granularity=TOK, dense=dense([2, 8]), token_ids=[5]),
        embedding(granularity=TOK, dense=dense([1, 8])),
    ]
    with pytest.raises(ContractViolation, match="1 token_ids for 2 token rows"):
        rules.finish_embed(call, bad, pb.TaskUsage(), EMBED)


@pytest.mark.parametrize(
    ("options", "output", "match"),
    [
        ({}, embedding(granularity=0), "granularity must be reported"),
        ({"granularity": SEQ}, embedding(granularity=TOK, dense=dense([1, 8])), "differs from the requested"),
        ({}, pb.EmbeddingOutput(granularity=SEQ), "no embedding"),
        ({"encoding": DENSE}, embedding(sparse=sparse([8], [1])), "sparse embedding for a dense request"),
        ({"encoding": SPARSE}, embedding(), "dense embedding for a sparse request"),
        ({}, embedding(dense=dense([2, 4])), "sequence output has shape"),
        ({}, embedding(granularity=TOK, dense=dense([8])), "token output has shape"),
        ({}, embedding(token_ids=[1]), "only for token granularity"),
        ({"dimensions": 4}, embedding(), "dimension 8 differs from the requested 4"),
        ({}, embedding(dense=dense([65])), "exceed the advertised limit 64"),
        ({}, embedding(dense=pb.DenseFloatTensor(shape=[2], values=[1.0, math.nan])), "finite"),
    ],
)
def test_embed_output_violations(options: dict[str, Any], output: pb.EmbeddingOutput, match: str) -> None:
    with pytest.raises(ContractViolation, match=match):
        rules.finish_embed(embed_call(**options), [output, output], pb.TaskUsage(), EMBED)


def test_embed_output_count_and_usage() -> None:
    with pytest.raises(ContractViolation, match="returned 1 outputs for 2 inputs"):
        rules.finish_embed(embed_call(), [embedding()], pb.TaskUsage(), EMBED)
    with pytest.raises(ContractViolation, match="cached_input_tokens"):
        rules.finish_embed(
            embed_call(), [embedding(), embedding()], pb.TaskUsage(input_tokens=1, cached_input_tokens=2), EMBED
        )


def test_sparse_embedding_accepted() -> None:
    call = embed_call(encoding=SPARSE)
    output = embedding(sparse=sparse([8], [0, 7]))
    response = rules.finish_embed(call, [output, output], pb.TaskUsage(), EMBED)
    assert response.outputs[1].sparse.indices == [0, 7]


# -- classify responses ------------------------------------------------------------------------------


def classification(**fields: Any) -> pb.ClassificationOutput:
    fields.setdefault("granularity", SEQ)
    fields.setdefault("semantics", LOGITS)
    fields.setdefault("scores", dense([3]))
    return pb.ClassificationOutput(**fields)


def test_classify_response() -> None:
    call = rules.parse_classify(classify_request(text("x"), granularity=TOK), MODEL)
    output = classification(granularity=TOK, scores=dense([2, 3]), labels=["a", "b", "c"], token_ids=[1, 2])
    response = rules.finish_classify(call, [output], pb.TaskUsage(input_tokens=2), CLASSIFY)
    (out,) = response.outputs
    assert out.item_id == "x" and out.HasField("input_index") and out.input_index == 0
    assert list(out.labels) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("options", "output", "match"),
    [
        ({}, classification(semantics=0), "semantics must be reported"),
        ({"output_semantics": PROBS}, classification(), "semantics 1 differs"),
        ({}, classification(labels=["a", "b"]), "2 labels for 3 classes"),
        ({}, classification(scores=dense([2, 3])), "sequence output"),
        ({}, classification(scores=pb.DenseFloatTensor(shape=[2], values=[1])), "holds 2 values"),
    ],
)
def test_classify_output_violations(options: dict[str, Any], output: pb.ClassificationOutput, match: str) -> None:
    call = rules.parse_classify(classify_request(**options), MODEL)
    with pytest.raises(ContractViolation, match=match):
        rules.finish_classify(call, [output], pb.TaskUsage(), CLASSIFY)


# -- score responses ---------------------------------------------------------------------------------


def score_call(**options: Any) -> Any:
    return rules.parse_score(score_request(group("g1", "q", "a", "b"), group("g2", "q", "c"), **options), MODEL)


def score_result(per_group: list[int], width: int = 1, **fields: Any) -> pb.ScoreResponse:
    fields.setdefault("granularity", SEQ)
    fields.setdefault("semantics", RELEVANCE)
    fields.setdefault("normalization", pb.SCORE_NORMALIZATION_NONE)
    return pb.ScoreResponse(
        groups=[
            pb.ScoreGroupOutput(candidates=[pb.ScoreCandidateOutput(scores=dense([width])) for _ in range(n)])
            for n in per_group
        ],
        **fields,
    )


def test_score_response_is_stamped_in_request_order() -> None:
    result = score_result([2, 1], width=2, higher_is_better=True, label_token_ids=[3, 9])
    response = rules.finish_score(score_call(label_token_ids=[9, 3]), result, pb.TaskUsage(input_tokens=3), SCORE)
    assert response.request_id == "r"
    assert list(response.label_token_ids) == [9, 3]  # the request's order, whatever the engine said
    assert [(g.group_id, g.HasField("group_index"), g.group_index) for g in response.groups] == [
        ("g1", True, 0),
        ("g2", True, 1),
    ]
    assert [
        [(c.candidate_id, c.HasField("candidate_index"), c.candidate_index) for c in g.candidates]
        for g in response.groups
    ] == [
        [("a", True, 0), ("b", True, 1)],
        [("c", True, 0)],
    ]
    assert response.higher_is_better and response.usage.input_tokens == 3


@pytest.mark.parametrize(
    ("options", "result", "match"),
    [
        ({}, score_result([2, 1], granularity=0), "granularity must be reported"),
        ({}, score_result([2, 1], semantics=0), "semantics must be reported"),
        ({}, score_result([2, 1], normalization=0), "normalization must be reported"),
        ({"normalization": pb.SCORE_NORMALIZATION_NONE}, score_result([2, 1], normalization=2), "differs"),
        ({}, score_result([2]), "returned 1 groups for 2 inputs"),
        ({}, score_result([2, 2]), "candidates of group 1"),
        ({"label_token_ids": [1, 2]}, score_result([2, 1], width=1), "do not align with the 2 labels"),
        ({}, score_result([2, 1], width=0), "positive dimensions"),
    ],
)
def test_score_output_violations(options: dict[str, Any], result: pb.ScoreResponse, match: str) -> None:
    with pytest.raises(ContractViolation, match=match):
        rules.finish_score(score_call(**options), result, pb.TaskUsage(), SCORE)


def test_score_candidate_value_limit() -> None:
    caps = pb.ScoreCapabilities()
    caps.CopyFrom(SCORE)
    caps.max_output_values_per_candidate = 1
    with pytest.raises(ContractViolation, match="limit 1"):
        rules.finish_score(score_call(), score_result([2, 1], width=2), pb.TaskUsage(), caps)
