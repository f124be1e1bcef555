"""``contract.generation``: every pre-acceptance rejection and every normalization of Generate."""

from __future__ import annotations

import math
from typing import Any

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.generation import (
    kv_session_from_proto,
    kv_session_to_proto,
    new_request_id,
    parse_generate,
    parse_media,
)
from openengine_gateway.errors import FailedPrecondition, InvalidArgument, RequestError
from openengine_gateway.spi import (
    CandidateSelection,
    Endpoint,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Media,
)

ALL_LOGPROBS = pb.LogprobCapabilities(
    supported=True,
    candidate_selection_modes=[
        pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
        pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
        pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
    ],
    max_top_n=5,
)
ALL_GUIDES = pb.GuidedDecodingCapabilities(supported=True, modes=range(1, 7))
EVERYTHING = pb.ModelInfo(
    max_context_length=16,
    max_output_tokens=8,
    supports_lora=True,
    supports_multimodal=True,
    generation=pb.GenerationCapabilities(
        prompt_logprobs=ALL_LOGPROBS,
        output_logprobs=ALL_LOGPROBS,
        guided_decoding=ALL_GUIDES,
        max_num_sequences=4,
        supports_priority=True,
        supports_stop_in_output=True,
        supports_cache_salt=True,
        supports_prefix_cache_bypass=True,
    ),
)
"""A model that advertises every generation option."""

NOTHING = pb.ModelInfo()
"""A model that reports nothing: every explicit option is unadvertised."""


def request(**fields: Any) -> pb.GenerateRequest:
    """A GenerateRequest with a text prompt unless an input is given."""
    if "prompt" not in fields and "token_ids" not in fields:
        fields["prompt"] = "hi"
    return pb.GenerateRequest(**fields)


def parse(
    message: pb.GenerateRequest, model: pb.ModelInfo = EVERYTHING, role: int = pb.ENGINE_ROLE_AGGREGATED
) -> GenerationRequest:
    return parse_generate(message, served_name="m", model=model, role=role)


def rejects(
    message: pb.GenerateRequest,
    kind: type[RequestError] = InvalidArgument,
    match: str | None = None,
    *,
    model: pb.ModelInfo = EVERYTHING,
    role: int = pb.ENGINE_ROLE_AGGREGATED,
) -> None:
    with pytest.raises(kind, match=match) as caught:
        parse(message, model, role)
    assert type(caught.value) is kind


# -- defaults -------------------------------------------------------------------------------


def test_minimal_request_defaults() -> None:
    parsed = parse(pb.GenerateRequest(request_id="r1", prompt="hello"), NOTHING)
    assert parsed.request_id == "r1"
    assert parsed.model == "m"
    assert parsed.prompt == "hello" and parsed.prompt_token_ids is None
    assert parsed.sampling.num_sequences == 1
    assert parsed.sampling.temperature is None and parsed.sampling.top_k is None and parsed.sampling.seed is None
    assert parsed.stopping.max_tokens is None and parsed.stopping.min_tokens == 0
    assert parsed.stopping.stop_texts == () and parsed.stopping.stop_token_ids == ()
    assert not parsed.stopping.ignore_eos and not parsed.stopping.include_stop_in_output
    assert parsed.output_logprobs is None and parsed.prompt_logprobs is None and parsed.prompt_logprob_start == 0
    assert parsed.guidance is None and parsed.kv_session is None and parsed.data_parallel_rank is None
    assert not parsed.bypass_prefix_cache and parsed.cache_salt is None
    assert parsed.media == () and parsed.lora_name is None and parsed.priority is None
    assert dict(parsed.metadata) == {}


def test_missing_request_id_is_generated() -> None:
    first, second = parse(request()).request_id, parse(request()).request_id
    assert first.startswith("gw-") and second.startswith("gw-") and first != second
    assert new_request_id() != new_request_id()


def test_metadata_is_kept() -> None:
    assert dict(parse(request(metadata={"a": "1", "b": ""})).metadata) == {"a": "1", "b": ""}


# -- input ----------------------------------------------------------------------------------


def test_input_is_required() -> None:
    rejects(pb.GenerateRequest(request_id="r"), match="prompt or token_ids")


def test_empty_prompt_and_empty_token_ids_are_rejected() -> None:
    rejects(pb.GenerateRequest(prompt=""), match="prompt must be non-empty")
    rejects(pb.GenerateRequest(token_ids=pb.TokenIds()), match="token_ids must be non-empty")


def test_token_ids_input() -> None:
    parsed = parse(request(token_ids=pb.TokenIds(ids=[5, 0, 5])))
    assert parsed.prompt is None
    assert list(parsed.prompt_token_ids or []) == [5, 0, 5]


def test_input_kind_follows_explicit_support() -> None:
    text_off = pb.ModelInfo(supports_text_input=False)
    ids_off = pb.ModelInfo(supports_token_ids_input=False)
    rejects(request(), model=text_off, match="token_ids only")
    rejects(request(token_ids=pb.TokenIds(ids=[1])), model=ids_off, match="text prompts only")
    # Absent support flags are unknown, not "unsupported": both inputs are accepted.
    assert parse(request(), NOTHING).prompt == "hi"
    assert parse(request(token_ids=pb.TokenIds(ids=[1])), NOTHING).prompt_token_ids == [1]
    assert parse(request(token_ids=pb.TokenIds(ids=[1])), text_off).prompt_token_ids == [1]


def test_token_prompt_must_leave_room_in_the_context() -> None:
    rejects(request(token_ids=pb.TokenIds(ids=[1] * 16)), match="context is 16")
    assert len(parse(request(token_ids=pb.TokenIds(ids=[1] * 15))).prompt_token_ids or []) == 15


# -- roles ----------------------------------------------------------------------------------


SESSION = pb.KvSessionRef(
    session_id="s1",
    transfer_backend="nixl",
    endpoints=[pb.KvEndpoint(host="10.0.0.1", port=7, protocol="tcp")],
    dp_rank=2,
)


def test_decode_engine_requires_a_session() -> None:
    rejects(request(), FailedPrecondition, "decode engine", role=pb.ENGINE_ROLE_DECODE)


@pytest.mark.parametrize("role", [pb.ENGINE_ROLE_AGGREGATED, pb.ENGINE_ROLE_PREFILL, pb.ENGINE_ROLE_UNSPECIFIED])
def test_only_decode_engines_accept_a_session(role: int) -> None:
    rejects(request(kv=pb.KvOptions(session=SESSION)), FailedPrecondition, "only a decode engine", role=role)


def test_decode_session_is_parsed() -> None:
    session = pb.KvSessionRef()
    session.CopyFrom(SESSION)
    session.attributes_struct.update({"n": 3, "flag": True, "list": [1, "a"], "obj": {"k": None}})
    parsed = parse(request(kv=pb.KvOptions(session=session)), role=pb.ENGINE_ROLE_DECODE)
    assert parsed.kv_session == KvSession(
        session_id="s1",
        transfer_backend="nixl",
        endpoints=(Endpoint("10.0.0.1", 7, "tcp"),),
        dp_rank=2,
        attributes={"n": 3.0, "flag": True, "list": [1.0, "a"], "obj": {"k": None}},
    )


def test_decode_session_needs_an_id() -> None:
    rejects(request(kv=pb.KvOptions(session=pb.KvSessionRef())), match="session_id", role=pb.ENGINE_ROLE_DECODE)


def test_prefill_engine_accepts_a_plain_request() -> None:
    assert parse(request(), role=pb.ENGINE_ROLE_PREFILL).kv_session is None


def test_kv_session_round_trip() -> None:
    session = KvSession("s", "nixl", (Endpoint("h", 1, "grpc"),), 3, {"x": 1.5, "nested": {"y": [True]}})
    assert kv_session_from_proto(kv_session_to_proto(session)) == session
    bare = kv_session_to_proto(KvSession("s"))
    assert not bare.HasField("attributes_struct")
    assert kv_session_from_proto(bare).attributes == {}


# -- sampling -------------------------------------------------------------------------------


def sampling(**fields: Any) -> pb.GenerateRequest:
    return request(sampling=pb.SamplingParams(**fields))


def test_explicit_zero_sampling_values_are_kept() -> None:
    """Optional scalars keep the difference between the engine default (None) and zero."""
    parsed = parse(
        sampling(temperature=0, min_p=0, frequency_penalty=0, presence_penalty=0, seed=0, top_k=7), NOTHING
    ).sampling
    assert parsed.temperature == 0.0 and parsed.min_p == 0.0 and parsed.seed == 0 and parsed.top_k == 7
    assert parsed.frequency_penalty == 0.0 and parsed.presence_penalty == 0.0
    assert parsed.top_p is None and parsed.repetition_penalty is None


@pytest.mark.parametrize(("top_k", "expected"), [(0, 0), (-1, 0), (1, 1), (40, 40)])
def test_top_k_zero_and_minus_one_mean_no_limit(top_k: int, expected: int) -> None:
    assert parse(sampling(top_k=top_k)).sampling.top_k == expected


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "finite"),
        ({"temperature": math.inf}, "finite"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "finite"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"num_sequences": 0}, "num_sequences"),
        ({"num_sequences": 5}, "advertised maximum"),
    ],
)
def test_sampling_rejections(fields: dict[str, Any], match: str) -> None:
    rejects(sampling(**fields), match=match)


def test_sampling_bounds_are_inclusive() -> None:
    parsed = parse(
        sampling(
            top_p=1.0, min_p=1.0, frequency_penalty=-2, presence_penalty=2, repetition_penalty=0.01, num_sequences=4
        )
    ).sampling
    assert parsed.top_p == 1.0 and parsed.min_p == 1.0 and parsed.num_sequences == 4


def test_num_sequences_without_an_advertised_maximum() -> None:
    assert parse(sampling(num_sequences=9), NOTHING).sampling.num_sequences == 9


# -- stopping -------------------------------------------------------------------------------


def stopping(**fields: Any) -> pb.GenerateRequest:
    return request(stopping=pb.StoppingOptions(**fields))


def test_stop_conditions_are_deduplicated_in_order() -> None:
    conditions = [
        pb.StopCondition(stop_text="b"),
        pb.StopCondition(stop_token_id=7),
        pb.StopCondition(stop_text="a"),
        pb.StopCondition(stop_text="b"),
        pb.StopCondition(stop_token_id=0),
        pb.StopCondition(stop_token_id=7),
    ]
    parsed = parse(stopping(conditions=conditions)).stopping
    assert parsed.stop_texts == ("b", "a")
    assert parsed.stop_token_ids == (7, 0)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"max_tokens": 0}, "max_tokens must be greater than zero"),
        ({"max_tokens": 9}, "max_output_tokens"),
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ({"min_tokens": 9}, r"min_tokens \(9\) exceeds the model's max_output_tokens"),  # without max_tokens
        ({"conditions": [pb.StopCondition()]}, r"conditions\[0\] sets neither"),
        ({"conditions": [pb.StopCondition(stop_token_id=1), pb.StopCondition(stop_text="")]}, r"conditions\[1\]"),
    ],
)
def test_stopping_rejections(fields: dict[str, Any], match: str) -> None:
    rejects(stopping(**fields), match=match)


def test_stopping_values() -> None:
    parsed = parse(stopping(max_tokens=8, min_tokens=8, ignore_eos=True, include_stop_in_output=True)).stopping
    assert (parsed.max_tokens, parsed.min_tokens, parsed.ignore_eos, parsed.include_stop_in_output) == (
        8,
        8,
        True,
        True,
    )
    assert parse(stopping(min_tokens=100), NOTHING).stopping.min_tokens == 100


@pytest.mark.parametrize("value", [True, False])
def test_include_stop_in_output_must_be_advertised(value: bool) -> None:
    rejects(stopping(include_stop_in_output=value), model=NOTHING, match="include_stop_in_output")
    off = pb.ModelInfo(generation=pb.GenerationCapabilities(supports_stop_in_output=False))
    rejects(stopping(include_stop_in_output=value), model=off, match="include_stop_in_output")


# -- logprobs -------------------------------------------------------------------------------


def response(**fields: Any) -> pb.GenerateRequest:
    return request(response=pb.ResponseOptions(**fields))


def caps(output: pb.LogprobCapabilities | None = None, prompt: pb.LogprobCapabilities | None = None) -> pb.ModelInfo:
    generation = pb.GenerationCapabilities()
    if output is not None:
        generation.output_logprobs.CopyFrom(output)
    if prompt is not None:
        generation.prompt_logprobs.CopyFrom(prompt)
    return pb.ModelInfo(generation=generation)


def test_output_logprobs_need_advertised_support() -> None:
    rejects(response(return_output_logprobs=True), model=NOTHING, match="output logprobs")
    rejects(response(return_output_logprobs=True), model=caps(pb.LogprobCapabilities()), match="output logprobs")
    unsupported = caps(pb.LogprobCapabilities(supported=False))
    rejects(response(return_output_logprobs=True), model=unsupported, match="output logprobs")
    assert parse(response(return_output_logprobs=True)).output_logprobs == LogprobRequest()


def test_explicit_false_asks_for_nothing() -> None:
    parsed = parse(response(return_output_logprobs=False, return_prompt_logprobs=False), NOTHING)
    assert parsed.output_logprobs is None and parsed.prompt_logprobs is None


def test_candidates_imply_logprobs() -> None:
    top = pb.CandidateTokenSelection(top_n=3)
    parsed = parse(response(output_candidates=top))
    assert parsed.output_logprobs == LogprobRequest(
        CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=3)
    )
    rejects(response(output_candidates=top), model=NOTHING, match="output logprobs")


def test_candidates_with_logprobs_refused_are_rejected() -> None:
    top = pb.CandidateTokenSelection(top_n=1)
    rejects(response(return_output_logprobs=False, output_candidates=top), match="requires return_output_logprobs")
    rejects(response(return_prompt_logprobs=False, prompt_candidates=top), match="requires return_prompt_logprobs")


def test_candidate_selection_modes() -> None:
    ids = pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[9, 2, 9, 0]))
    assert parse(response(output_candidates=ids)).output_logprobs == LogprobRequest(
        CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, token_ids=(9, 2, 0))
    )
    every = pb.CandidateTokenSelection(all=pb.AllCandidates())
    assert parse(response(output_candidates=every)).output_logprobs == LogprobRequest(
        CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL)
    )
    zero = pb.CandidateTokenSelection(top_n=0)
    assert parse(response(output_candidates=zero)).output_logprobs == LogprobRequest(
        CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=0)
    )


def test_candidate_selection_rejections() -> None:
    rejects(response(output_candidates=pb.CandidateTokenSelection()), match="sets no selection")
    rejects(response(output_candidates=pb.CandidateTokenSelection(top_n=6)), match=r"top_n \(6\) exceeds")
    rejects(response(output_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds())), match="non-empty")
    top_n_only = caps(
        pb.LogprobCapabilities(supported=True, candidate_selection_modes=[pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N])
    )
    every = pb.CandidateTokenSelection(all=pb.AllCandidates())
    rejects(response(output_candidates=every), model=top_n_only, match="all candidate selection")
    # No max_top_n reported: any N is accepted.
    assert parse(response(output_candidates=pb.CandidateTokenSelection(top_n=1000)), top_n_only).output_logprobs


def test_prompt_and_output_capabilities_are_independent() -> None:
    output_only = caps(output=ALL_LOGPROBS)
    assert parse(response(return_output_logprobs=True), output_only).output_logprobs is not None
    rejects(response(return_prompt_logprobs=True), model=output_only, match="prompt logprobs")
    prompt_top_n = caps(
        output=ALL_LOGPROBS,
        prompt=pb.LogprobCapabilities(
            supported=True, candidate_selection_modes=[pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N], max_top_n=1
        ),
    )
    rejects(response(prompt_candidates=pb.CandidateTokenSelection(top_n=2)), model=prompt_top_n, match="maximum")
    assert parse(response(output_candidates=pb.CandidateTokenSelection(top_n=5)), prompt_top_n).output_logprobs


def test_prompt_logprob_start() -> None:
    rejects(response(prompt_logprob_start=1), match="requires return_prompt_logprobs")
    tokens = pb.TokenIds(ids=[1, 2, 3])
    parsed = parse(
        request(token_ids=tokens, response=pb.ResponseOptions(return_prompt_logprobs=True, prompt_logprob_start=2))
    )
    assert parsed.prompt_logprob_start == 2
    rejects(
        request(token_ids=tokens, response=pb.ResponseOptions(return_prompt_logprobs=True, prompt_logprob_start=3)),
        match="past the prompt",
    )
    # A text prompt's length is unknown before tokenization: the start is passed through.
    assert parse(response(return_prompt_logprobs=True, prompt_logprob_start=50)).prompt_logprob_start == 50


# -- scheduling, LoRA, cache ----------------------------------------------------------------


@pytest.mark.parametrize("priority", [0, -3, 10])
def test_priority(priority: int) -> None:
    assert parse(request(priority=priority)).priority == priority
    rejects(request(priority=priority), model=NOTHING, match="priority")


def test_lora_name_needs_advertised_support() -> None:
    assert parse(request(lora_name="a")).lora_name == "a"
    rejects(request(lora_name="a"), FailedPrecondition, model=NOTHING, match="LoRA")
    rejects(request(lora_name="a"), FailedPrecondition, model=pb.ModelInfo(supports_lora=False), match="LoRA")


def test_cache_options() -> None:
    parsed = parse(request(kv=pb.KvOptions(cache_salt="tenant", bypass_prefix_cache=True, data_parallel_rank=0)))
    assert parsed.cache_salt == "tenant" and parsed.bypass_prefix_cache and parsed.data_parallel_rank == 0
    rejects(request(kv=pb.KvOptions(cache_salt="")), match="non-empty")
    rejects(request(kv=pb.KvOptions(cache_salt="t")), model=NOTHING, match="cache_salt")
    rejects(request(kv=pb.KvOptions(bypass_prefix_cache=True)), model=NOTHING, match="bypass_prefix_cache")
    # Options that are absent are not checked against the capabilities.
    assert parse(request(kv=pb.KvOptions(data_parallel_rank=1)), NOTHING).data_parallel_rank == 1


# -- guided decoding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guide", "expected"),
    [
        (pb.GuidedDecoding(json_schema='{"type": "object"}'), Guidance(1, spec='{"type": "object"}')),
        (pb.GuidedDecoding(regex="a+", backend="xgrammar"), Guidance(2, spec="a+", backend="xgrammar")),
        (pb.GuidedDecoding(ebnf_grammar="root ::= x"), Guidance(3, spec="root ::= x")),
        (pb.GuidedDecoding(structural_tag="{}"), Guidance(4, spec="{}")),
        (pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["y", "n"])), Guidance(5, choices=("y", "n"))),
        (pb.GuidedDecoding(json_object=pb.JsonObjectConstraint()), Guidance(6)),
    ],
)
def test_guided_modes(guide: pb.GuidedDecoding, expected: Guidance) -> None:
    assert parse(request(guided=guide)).guidance == expected
    rejects(request(guided=guide), model=NOTHING, match="guided decoding")
    others = pb.ModelInfo(
        generation=pb.GenerationCapabilities(
            guided_decoding=pb.GuidedDecodingCapabilities(
                supported=True, modes=[m for m in range(1, 7) if m != expected.mode]
            )
        )
    )
    rejects(request(guided=guide), model=others, match="guided decoding")


def test_guided_without_a_guide() -> None:
    assert parse(request(guided=pb.GuidedDecoding()), NOTHING).guidance is None
    rejects(request(guided=pb.GuidedDecoding(backend="outlines")), match="no guide")


def test_guided_support_flag_is_required() -> None:
    listed_only = pb.ModelInfo(
        generation=pb.GenerationCapabilities(guided_decoding=pb.GuidedDecodingCapabilities(modes=[2]))
    )
    rejects(request(guided=pb.GuidedDecoding(regex="a")), model=listed_only, match="guided decoding")


@pytest.mark.parametrize(
    ("guide", "match"),
    [
        (pb.GuidedDecoding(choice=pb.ChoiceConstraint()), "choices"),
        (pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["a", ""])), "choices"),
        (pb.GuidedDecoding(regex=""), "guided.regex must be non-empty"),
        (pb.GuidedDecoding(json_schema="{not json"), "not valid JSON"),
        (pb.GuidedDecoding(structural_tag="[1,"), "not valid JSON"),
    ],
)
def test_guided_rejections(guide: pb.GuidedDecoding, match: str) -> None:
    rejects(request(guided=guide), match=match)


# -- media ----------------------------------------------------------------------------------


def test_media_sources_and_default_modality() -> None:
    media = [
        pb.MediaItem(url="https://x/a.png", uuid="u1"),
        pb.MediaItem(modality=pb.MODALITY_AUDIO, data_uri="data:audio/wav;base64,AA=="),
        pb.MediaItem(modality=pb.MODALITY_VIDEO, raw_bytes=b"\x00", mime_type="video/mp4"),
    ]
    assert parse(request(media=media)).media == (
        Media(pb.MODALITY_IMAGE, url="https://x/a.png", uuid="u1"),
        Media(pb.MODALITY_AUDIO, data_uri="data:audio/wav;base64,AA=="),
        Media(pb.MODALITY_VIDEO, raw_bytes=b"\x00", mime_type="video/mp4"),
    )


@pytest.mark.parametrize(
    ("item", "match"),
    [
        (pb.MediaItem(), r"media\[0\] sets no source"),
        (pb.MediaItem(url=""), "url must be non-empty"),
        (pb.MediaItem(url="ftp://x"), "http"),
        (pb.MediaItem(url="file:///etc/passwd"), "http"),
        (pb.MediaItem(data_uri="base64,AA"), "data:"),
        (pb.MediaItem(raw_bytes=b""), "raw_bytes must be non-empty"),
        (pb.MediaItem(modality=9, url="http://x"), "modality 9 is unknown"),
    ],
)
def test_media_rejections(item: pb.MediaItem, match: str) -> None:
    rejects(request(media=[item]), match=match)


def test_media_needs_advertised_multimodal_support() -> None:
    rejects(request(media=[pb.MediaItem(url="http://x")]), model=NOTHING, match="multimodal")
    rejects(
        request(media=[pb.MediaItem(url="http://x")]), model=pb.ModelInfo(supports_multimodal=False), match="multimodal"
    )


def test_parse_media_restricts_modalities() -> None:
    model = pb.ModelInfo(supports_multimodal=True)
    items = [pb.MediaItem(url="http://x")]
    assert parse_media(items, model, modalities=[pb.MODALITY_IMAGE])[0].modality == pb.MODALITY_IMAGE
    with pytest.raises(InvalidArgument, match="MODALITY_IMAGE is not advertised"):
        parse_media(items, model, modalities=[pb.MODALITY_AUDIO])
    assert parse_media([], NOTHING) == ()
