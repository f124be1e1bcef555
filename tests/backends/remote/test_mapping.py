"""``remote.mapping``: a validated request restated for the remote parses back to itself."""

from __future__ import annotations

import pytest
from openengine_backends.mock import MockSettings
from openengine_backends.mock.capabilities import model_info
from openengine_backends.remote.mapping import (
    classify_request,
    embed_request,
    generate_request,
    kv_session_ref,
    score_request,
)
from openengine_gateway import pb
from openengine_gateway.contract.generation import parse_generate
from openengine_gateway.contract.tasks import parse_classify, parse_embed, parse_score
from openengine_gateway.spi.wire import kv_session


def everything() -> pb.ModelInfo:
    """A model that advertises every option, so every field of a request can be exercised."""
    info = model_info(MockSettings(enable_multimodal=True))
    info.generation.guided_decoding.modes[:] = [m for m in pb.GuidedDecodingMode.values() if m]
    for task in (info.tasks.embed, info.tasks.classify, info.tasks.score):
        task.supports_priority = True
    info.served_model_name = "front"
    return info


MODEL = everything()
SESSION = pb.KvSessionRef(
    session_id="s1",
    transfer_backend="nixl",
    endpoints=[pb.KvEndpoint(host="p0", port=7, protocol="tcp")],
    dp_rank=1,
)
SESSION.attributes_struct.update({"remote_port": 5600, "blocks": [1, 2], "flag": True})

REQUESTS = {
    "text, defaults": pb.GenerateRequest(request_id="r", prompt="hello"),
    "token ids, every sampling knob": pb.GenerateRequest(
        request_id="r",
        token_ids=pb.TokenIds(ids=[5, 6, 7]),
        sampling=pb.SamplingParams(
            temperature=0.0,
            top_p=0.5,
            top_k=-1,
            min_p=0.0,
            frequency_penalty=-1.5,
            presence_penalty=0.0,
            repetition_penalty=1.1,
            seed=0,
            num_sequences=3,
        ),
    ),
    "stopping": pb.GenerateRequest(
        request_id="r",
        prompt="p",
        stopping=pb.StoppingOptions(
            max_tokens=9,
            min_tokens=2,
            conditions=[
                pb.StopCondition(stop_token_id=4),
                pb.StopCondition(stop_text="."),
                pb.StopCondition(stop_text="."),
            ],
            ignore_eos=True,
            include_stop_in_output=True,
        ),
    ),
    "explicit defaults": pb.GenerateRequest(
        request_id="r",
        prompt="p",
        sampling=pb.SamplingParams(num_sequences=1, top_k=0),
        stopping=pb.StoppingOptions(min_tokens=0, include_stop_in_output=False),
        response=pb.ResponseOptions(return_prompt_logprobs=False, return_output_logprobs=False),
        kv=pb.KvOptions(bypass_prefix_cache=False),
    ),
    "logprobs top_n and all": pb.GenerateRequest(
        request_id="r",
        token_ids=pb.TokenIds(ids=[1, 2, 3, 4]),
        response=pb.ResponseOptions(
            return_prompt_logprobs=True,
            prompt_candidates=pb.CandidateTokenSelection(all=pb.AllCandidates()),
            prompt_logprob_start=2,
            output_candidates=pb.CandidateTokenSelection(top_n=0),
        ),
    ),
    "logprobs token ids": pb.GenerateRequest(
        request_id="r",
        prompt="p",
        response=pb.ResponseOptions(
            return_output_logprobs=True,
            output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[3, 1, 3])),
            return_prompt_logprobs=True,
        ),
    ),
    "kv, lora, priority, metadata": pb.GenerateRequest(
        request_id="r",
        prompt="p",
        kv=pb.KvOptions(data_parallel_rank=0, bypass_prefix_cache=True, cache_salt="salt"),
        lora_name="adapter",
        priority=-3,
        metadata={"tenant": "a", "trace": "b"},
    ),
    "media": pb.GenerateRequest(
        request_id="r",
        prompt="p",
        media=[
            pb.MediaItem(url="https://example.com/a.png", uuid="u1"),
            pb.MediaItem(modality=pb.MODALITY_AUDIO, data_uri="data:audio/wav;base64,AAAA"),
            pb.MediaItem(modality=pb.MODALITY_VIDEO, raw_bytes=b"\x00\x01", mime_type="video/mp4"),
        ],
    ),
    **{
        f"guided {kind}": pb.GenerateRequest(request_id="r", prompt="p", guided=guided)
        for kind, guided in {
            "json_schema": pb.GuidedDecoding(json_schema='{"type": "object"}', backend="xgrammar"),
            "regex": pb.GuidedDecoding(regex="[a-z]+"),
            "ebnf": pb.GuidedDecoding(ebnf_grammar="root ::= 'a'"),
            "structural_tag": pb.GuidedDecoding(structural_tag='{"tags": []}'),
            "choice": pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["yes", "no"])),
            "json_object": pb.GuidedDecoding(json_object=pb.JsonObjectConstraint()),
        }.items()
    },
}


@pytest.mark.parametrize("request_", REQUESTS.values(), ids=REQUESTS.keys())
def test_generation_round_trip(request_: pb.GenerateRequest) -> None:
    parsed = parse_generate(request_, served_name="front", model=MODEL, role=pb.ENGINE_ROLE_AGGREGATED)
    restated = generate_request(parsed, "back")
    assert restated.model == "back" and restated.request_id == parsed.request_id
    again = parse_generate(restated, served_name="front", model=MODEL, role=pb.ENGINE_ROLE_AGGREGATED)
    assert again == parsed


def test_decode_session_round_trip() -> None:
    request_ = pb.GenerateRequest(request_id="d", prompt="p", kv=pb.KvOptions(session=SESSION))
    parsed = parse_generate(request_, served_name="front", model=MODEL, role=pb.ENGINE_ROLE_DECODE)
    restated = generate_request(parsed, "back")
    assert restated.kv.session == SESSION
    assert parse_generate(restated, served_name="front", model=MODEL, role=pb.ENGINE_ROLE_DECODE) == parsed


def test_the_remote_session_conversions_are_inverse() -> None:
    session = kv_session(SESSION)
    assert session.attributes == {"remote_port": 5600, "blocks": [1, 2], "flag": True}
    assert kv_session_ref(session) == SESSION and kv_session(kv_session_ref(session)) == session


def test_defaults_stay_unset_for_the_remote_to_resolve() -> None:
    parsed = parse_generate(REQUESTS["explicit defaults"], served_name="front", model=MODEL, role=1)
    restated = generate_request(parsed, "back")
    assert not restated.HasField("sampling") or not restated.sampling.HasField("num_sequences")
    assert not restated.stopping.HasField("include_stop_in_output") and not restated.stopping.HasField("min_tokens")
    assert not restated.HasField("response") and not restated.kv.HasField("bypass_prefix_cache")
    assert restated.sampling.HasField("top_k") and restated.sampling.top_k == 0  # explicit "no limit" stays explicit


CONTEXT = pb.TaskRequestContext(request_id="t", model="front", priority=2, lora_name="adapter", metadata={"k": "v"})
ITEMS = [
    pb.TaskInput(item_id="a", text="some text"),
    pb.TaskInput(item_id="b", token_ids=pb.TokenIds(ids=[1, 2])),
    pb.TaskInput(
        item_id="c",
        multimodal=pb.MultimodalTaskInput(text="caption", media=[pb.MediaItem(url="https://example.com/i.png")]),
    ),
    pb.TaskInput(
        item_id="d",
        multimodal=pb.MultimodalTaskInput(
            token_ids=pb.TokenIds(ids=[3]), media=[pb.MediaItem(modality=pb.MODALITY_AUDIO, raw_bytes=b"x")]
        ),
    ),
    pb.TaskInput(item_id="e", multimodal=pb.MultimodalTaskInput(media=[pb.MediaItem(data_uri="data:,x")])),
]


@pytest.mark.parametrize(
    "options",
    [
        pb.EmbedOptions(),
        pb.EmbedOptions(
            granularity=pb.TASK_OUTPUT_GRANULARITY_TOKEN,
            normalize=False,
            dimensions=8,
            encoding=pb.EMBEDDING_ENCODING_SPARSE,
        ),
    ],
)
def test_embed_round_trip(options: pb.EmbedOptions) -> None:
    call = parse_embed(pb.EmbedRequest(context=CONTEXT, inputs=ITEMS, options=options), MODEL)
    assert embed_request(call, "back").context.model == "back"
    assert parse_embed(embed_request(call, "front"), MODEL) == call


def test_embed_without_optional_context() -> None:
    context = pb.TaskRequestContext(request_id="t", model="front")
    call = parse_embed(pb.EmbedRequest(context=context, inputs=ITEMS[:1]), MODEL)
    restated = embed_request(call, "front")
    assert not restated.context.HasField("priority") and not restated.context.lora_name
    assert not restated.HasField("options")
    assert parse_embed(restated, MODEL) == call


def test_classify_round_trip() -> None:
    options = pb.ClassifyOptions(
        granularity=pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, output_semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES
    )
    call = parse_classify(pb.ClassifyRequest(context=CONTEXT, inputs=ITEMS, options=options), MODEL)
    assert parse_classify(classify_request(call, "front"), MODEL) == call


@pytest.mark.parametrize(
    "options",
    [
        pb.ScoreOptions(),
        pb.ScoreOptions(
            granularity=pb.TASK_OUTPUT_GRANULARITY_SEQUENCE,
            output_semantics=pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES,
            normalization=pb.SCORE_NORMALIZATION_SOFTMAX,
            label_token_ids=[9, 4],
            instruction="Is it relevant?",
        ),
    ],
)
def test_score_round_trip(options: pb.ScoreOptions) -> None:
    groups = [
        pb.ScoreGroup(group_id="g1", query=ITEMS[0], candidates=ITEMS[1:3]),
        pb.ScoreGroup(group_id="g2", query=ITEMS[1], candidates=[ITEMS[0], ITEMS[4]]),
    ]
    call = parse_score(pb.ScoreRequest(context=CONTEXT, groups=groups, options=options), MODEL)
    assert parse_score(score_request(call, "front"), MODEL) == call
