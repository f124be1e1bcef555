"""``GenerationRequest`` → SGLang ``GenerateReqInput`` fields, without SGLang."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from openengine_backends.sglang.mapping import (
    JSON_OBJECT_SCHEMA,
    MAX_CANDIDATES,
    EngineLimits,
    choice_regex,
    decode_bootstrap,
    eos_token_ids,
    plan_generation,
    prefill_kwargs,
    prefill_session,
    request_rid,
    signed_seed,
)
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    CandidateSelection,
    Endpoint,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Media,
    Sampling,
    Stopping,
)

LIMITS = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, grammar_backend="xgrammar")
TOP_N, IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


def request(**fields: object) -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=[5, 6, 7], **fields)  # type: ignore[arg-type]


def sampling_of(req: GenerationRequest, limits: EngineLimits = LIMITS, **kw: object) -> dict[str, object]:
    plan = plan_generation(req, limits, input_ids=kw.get("ids", req.prompt_token_ids))  # type: ignore[arg-type]
    return plan.outputs[0]["sampling_params"]  # type: ignore[no-any-return]


def test_max_new_tokens_is_always_set_to_the_callers_budget_or_the_rest_of_the_context() -> None:
    assert sampling_of(request(stopping=Stopping(max_tokens=8)))["max_new_tokens"] == 8
    assert sampling_of(request())["max_new_tokens"] == 97, "SGLang's own default of 128 is never used"
    with pytest.raises(InvalidArgument, match="exceeds the context"):
        sampling_of(request(stopping=Stopping(max_tokens=98)))
    with pytest.raises(InvalidArgument, match="at most 94"):
        plan_generation(request(), LIMITS, input_ids=[1] * 95)


def test_a_multimodal_prompt_goes_as_text_and_lets_sglang_bound_the_output() -> None:
    image = Media(pb.MODALITY_IMAGE, url="https://x/cat.png")
    raw = Media(pb.MODALITY_IMAGE, raw_bytes=b"\x89PNG", mime_type="image/png")
    req = GenerationRequest(request_id="r", model="m", prompt="what is it", media=(image, raw))
    plan = plan_generation(req, LIMITS, input_ids=None)
    assert plan.shared["text"] == "what is it"
    assert plan.shared["image_data"] == ["https://x/cat.png", "data:image/png;base64,iVBORw=="]
    assert plan.outputs[0]["sampling_params"]["max_new_tokens"] is None
    prefill = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, role=pb.ENGINE_ROLE_PREFILL)
    with pytest.raises(InvalidArgument, match="no media"):
        plan_generation(req, prefill, input_ids=None)


def test_sampling_knobs_and_openengines_top_k_off_becomes_minus_one() -> None:
    sampling = Sampling(temperature=0.5, top_p=0.9, top_k=0, min_p=0.1, frequency_penalty=0.5, repetition_penalty=1.2)
    values = sampling_of(request(sampling=sampling))
    assert values["top_k"] == -1
    assert (values["temperature"], values["top_p"], values["min_p"]) == (0.5, 0.9, 0.1)
    assert values["frequency_penalty"] == 0.5 and values["repetition_penalty"] == 1.2
    assert "presence_penalty" not in values, "unset knobs keep SGLang's (or the model's) default"
    defaults = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, sampling_defaults={"temperature": 0.7})
    assert sampling_of(request(), defaults)["temperature"] == 0.7
    with pytest.raises(InvalidArgument, match=r"up to 2\.0"):
        sampling_of(request(sampling=Sampling(repetition_penalty=2.5)))


def test_seeds_need_deterministic_inference_and_differ_per_output() -> None:
    with pytest.raises(InvalidArgument, match="deterministic"):
        sampling_of(request(sampling=Sampling(seed=3)))
    deterministic = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, deterministic=True)
    plan = plan_generation(request(sampling=Sampling(seed=2**64 - 1, num_sequences=3)), deterministic, input_ids=[1])
    assert [o["sampling_params"]["sampling_seed"] for o in plan.outputs] == [-1, 0, 1]
    assert signed_seed(2**63) == -(2**63) and signed_seed(5) == 5


def test_unseeded_outputs_differ_in_deterministic_mode() -> None:
    """SGLang seeds every unseeded request 42 there: several outputs would all be the same sample."""
    deterministic = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, deterministic=True)
    several = plan_generation(request(sampling=Sampling(num_sequences=3)), deterministic, input_ids=[1])
    assert [o["sampling_params"]["sampling_seed"] for o in several.outputs] == [42, 43, 44]
    one = plan_generation(request(), deterministic, input_ids=[1])
    assert "sampling_seed" not in one.outputs[0]["sampling_params"], "one output keeps SGLang's own default"
    sampled = plan_generation(request(sampling=Sampling(num_sequences=3)), LIMITS, input_ids=[1])
    assert all("sampling_seed" not in o["sampling_params"] for o in sampled.outputs), "random without the mode"


def test_stopping_maps_to_sglangs_names() -> None:
    stopping = Stopping(max_tokens=9, min_tokens=2, stop_token_ids=(3,), include_stop_in_output=True)
    values = sampling_of(request(stopping=stopping))
    assert values == {
        "max_new_tokens": 9,
        "min_new_tokens": 2,
        "ignore_eos": False,
        "no_stop_trim": True,
        "stop_token_ids": [3],
    }
    assert sampling_of(request(stopping=Stopping(max_tokens=9, stop_texts=("x",))))["stop"] == ["x"]
    with pytest.raises(InvalidArgument, match="stop strings from the first token"):
        sampling_of(request(stopping=Stopping(min_tokens=2, stop_texts=("x",))))
    watched = sampling_of(request(stopping=Stopping(ignore_eos=True, stop_token_ids=(3,))))
    assert watched["ignore_eos"] and "stop_token_ids" not in watched, "SGLang's ignore_eos disables every token stop"
    with pytest.raises(InvalidArgument, match="at most 32"):
        sampling_of(request(stopping=Stopping(stop_texts=tuple(str(i) for i in range(33)))))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        sampling_of(request(stopping=Stopping(stop_token_ids=(500,))))


@pytest.mark.parametrize("stopping", [Stopping(stop_texts=("x",)), Stopping(min_tokens=2)], ids=["text", "min"])
def test_without_a_tokenizer_what_needs_one_is_refused_before_acceptance(stopping: Stopping) -> None:
    tokenless = replace(LIMITS, has_tokenizer=False)
    with pytest.raises(InvalidArgument, match="without a tokenizer"):
        sampling_of(request(stopping=stopping), tokenless)
    assert sampling_of(request(stopping=Stopping(stop_token_ids=(3,))), tokenless)["stop_token_ids"] == [3]


def test_one_logprob_configuration_is_the_union_of_both_sides() -> None:
    req = request(
        output_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=2)),
        prompt_logprobs=LogprobRequest(CandidateSelection(IDS, token_ids=(9, 4))),
        prompt_logprob_start=2,
    )
    plan = plan_generation(req, LIMITS, input_ids=[5, 6, 7])
    assert plan.shared["return_logprob"] and plan.shared["return_text_in_logprobs"]
    assert plan.shared["top_logprobs_num"] == 2 and plan.shared["token_ids_logprob"] == [9, 4]
    assert plan.outputs[0]["logprob_start_len"] == 1, "SGLang's first prompt entry has no logprob: start one earlier"
    every = request(output_logprobs=LogprobRequest(CandidateSelection(ALL)))
    assert plan_generation(every, LIMITS, input_ids=[1])
    assert plan_generation(every, LIMITS, input_ids=[1]).shared["top_logprobs_num"] == 128
    only_output = plan_generation(request(output_logprobs=LogprobRequest()), LIMITS, input_ids=[1])
    assert only_output.outputs[0]["logprob_start_len"] == -1 and "top_logprobs_num" not in only_output.shared


def test_candidates_are_bounded_since_sglang_detokenizes_each_on_the_gateways_loop() -> None:
    big = replace(LIMITS, vocab_size=128_000)
    bound = MAX_CANDIDATES
    with pytest.raises(InvalidArgument, match="all 128000 vocabulary entries"):
        plan_generation(request(output_logprobs=LogprobRequest(CandidateSelection(ALL))), big, input_ids=[1])
    with pytest.raises(InvalidArgument, match=f"top_n {bound + 1} is above this engine's maximum"):
        plan_generation(
            request(prompt_logprobs=LogprobRequest(CandidateSelection(TOP_N, bound + 1))), big, input_ids=[1]
        )
    many = CandidateSelection(IDS, token_ids=tuple(range(bound + 1)))
    with pytest.raises(InvalidArgument, match=f"at most {bound} candidate token ids"):
        plan_generation(request(output_logprobs=LogprobRequest(many)), big, input_ids=[1])
    most = request(output_logprobs=LogprobRequest(CandidateSelection(TOP_N, bound)))
    assert plan_generation(most, big, input_ids=[1]).shared["top_logprobs_num"] == bound


def test_several_outputs_ask_for_prompt_logprobs_once() -> None:
    req = request(sampling=Sampling(num_sequences=2, temperature=1.0), prompt_logprobs=LogprobRequest())
    plan = plan_generation(req, LIMITS, input_ids=[1, 2])
    assert [o["logprob_start_len"] for o in plan.outputs] == [0, -1]


@pytest.mark.parametrize(
    ("guidance", "expected"),
    [
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_SCHEMA, spec="{}"), {"json_schema": "{}"}),
        (Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a+"), {"regex": "a+"}),
        (Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, spec='root ::= "a"'), {"ebnf": 'root ::= "a"'}),
        (Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec="{}"), {"structural_tag": "{}"}),
        (Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("yes", "a.b")), {"regex": r"(yes|a\.b)"}),
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_OBJECT), {"json_schema": JSON_OBJECT_SCHEMA}),
    ],
)
def test_guides(guidance: Guidance, expected: dict[str, str]) -> None:
    values = sampling_of(request(guidance=guidance))
    assert {key: values[key] for key in expected} == expected


def test_guides_need_the_engines_backend() -> None:
    guide = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a", backend="outlines")
    with pytest.raises(InvalidArgument, match="per engine"):
        sampling_of(request(guidance=guide))
    off = EngineLimits(max_context=100, max_prompt=94, vocab_size=128)
    with pytest.raises(InvalidArgument, match="without a grammar backend"):
        sampling_of(request(guidance=Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a")), off)
    assert choice_regex(("(x)", "1+1", "a b")) == r"(\(x\)|1\+1|a b)"


def test_llguidance_takes_only_legacy_structural_tags() -> None:
    """SGLang's llguidance backend asserts the legacy form; refused before acceptance, not aborted after."""
    llguidance = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, grammar_backend="llguidance")
    legacy = json.dumps({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<f>"]})
    tag = Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec=legacy)
    assert sampling_of(request(guidance=tag), llguidance)["structural_tag"] == legacy
    formatted = Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec=json.dumps({"format": {"type": "any_text"}}))
    with pytest.raises(InvalidArgument, match="'structures' and 'triggers'"):
        sampling_of(request(guidance=formatted), llguidance)
    with pytest.raises(InvalidArgument, match="not JSON"):
        sampling_of(request(guidance=Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec="{")), llguidance)
    assert "structural_tag" in sampling_of(request(guidance=formatted)), "xgrammar takes both forms"


def test_priority_follows_sglangs_direction() -> None:
    with pytest.raises(InvalidArgument, match="priority scheduling"):
        plan_generation(request(priority=3), LIMITS, input_ids=[1])
    on = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, priority_scheduling=True)
    assert plan_generation(request(priority=3), on, input_ids=[1]).shared["priority"] == 3
    low = EngineLimits(
        max_context=100, max_prompt=94, vocab_size=128, priority_scheduling=True, low_priority_values_first=True
    )
    assert plan_generation(request(priority=3), low, input_ids=[1]).shared["priority"] == -3


def test_routing_lora_and_cache_salt() -> None:
    shared = plan_generation(
        request(lora_name="ad", cache_salt="tenant", data_parallel_rank=1), LIMITS, input_ids=[1]
    ).shared
    assert (shared["lora_path"], shared["cache_salt"], shared["routed_dp_rank"]) == ("ad", "tenant", 1)
    assert shared["stream"] is True and shared["input_ids"] == [1]


def test_prefill_sessions_carry_the_bootstrap_and_decode_reads_it_back() -> None:
    limits = EngineLimits(max_context=100, max_prompt=94, vocab_size=128, dp_ranks=4, transfer_backend="mooncake")
    session = prefill_session("r", host="p0", port=8998, room=2**52 + 3, limits=limits, routed_rank=None)
    assert session == KvSession(
        "r@4503599627370499",
        "mooncake",
        (Endpoint("p0", 8998, "http"),),
        3,
        {"bootstrap_host": "p0", "bootstrap_port": 8998, "bootstrap_room": 2**52 + 3},
    )
    assert prefill_kwargs(session) == {"bootstrap_host": "p0", "bootstrap_port": 8998, "bootstrap_room": 2**52 + 3}
    routed = prefill_session("r", host="p0", port=1, room=8, limits=limits, routed_rank=2)
    assert routed.dp_rank == 2 and prefill_kwargs(routed)["disagg_prefill_dp_rank"] == 2
    as_struct = KvSession(
        "s", "mooncake", attributes={"bootstrap_host": "p0", "bootstrap_port": 8998.0, "bootstrap_room": "12"}
    )
    assert decode_bootstrap(as_struct, limits) == {"bootstrap_host": "p0", "bootstrap_port": 8998, "bootstrap_room": 12}
    with pytest.raises(InvalidArgument, match="transfer backend"):
        decode_bootstrap(KvSession("s", "nixl", attributes=dict(as_struct.attributes)), limits)
    with pytest.raises(InvalidArgument, match="bootstrap_host"):
        decode_bootstrap(KvSession("s"), limits)
    with pytest.raises(InvalidArgument, match="integer"):
        decode_bootstrap(KvSession("s", attributes={"bootstrap_host": "p", "bootstrap_port": 1.5}), limits)


def test_request_ids_are_prefix_free() -> None:
    """SGLang aborts every request whose id starts with the one aborted: ``r1`` must not reach ``r10``."""
    serials = iter(range(1, 1000))
    rids = [request_rid(next(serials), rid, i) for rid in ["r", "r1", "r10", "r"] for i in range(11)]
    assert len(set(rids)) == len(rids)
    assert not any(a != b and b.startswith(a) for a in rids for b in rids)


def test_eos_ids_join_the_tokenizers_and_the_model_configs() -> None:
    assert eos_token_ids(2, [7], {2, 5}) == (2, 7, 5)
    assert eos_token_ids(None, None, set()) == ()
