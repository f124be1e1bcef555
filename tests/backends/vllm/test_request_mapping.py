"""Request → vLLM parameters, for every mapped ``GenerateRequest`` field."""

from __future__ import annotations

from dataclasses import replace

import pytest
from openengine_backends.vllm import mapping
from openengine_backends.vllm.mapping import EngineLimits, plan_generation, prompt_input
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    CandidateSelection,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Sampling,
    Stopping,
)

LIMITS = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, eos_token_ids=(1,))
TOP_N, IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


def request(**fields: object) -> GenerationRequest:
    fields.setdefault("prompt_token_ids", [0, 5, 6, 7])
    return GenerationRequest(request_id="r", model="m", **fields)  # type: ignore[arg-type]


def test_prompt_input_text_tokens_and_cache_salt() -> None:
    assert prompt_input(request()) == {"prompt_token_ids": [0, 5, 6, 7]}
    text = GenerationRequest(request_id="r", model="m", prompt="hi", cache_salt="tenant-a")
    assert prompt_input(text) == {"prompt": "hi", "cache_salt": "tenant-a"}


def test_sampling_knobs_map_by_name_and_unset_ones_use_model_defaults() -> None:
    sampling = Sampling(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        repetition_penalty=1.2,
        seed=2**63 + 5,
        num_sequences=3,
    )
    plan = plan_generation(request(sampling=sampling), LIMITS, prompt_len=4).sampling
    for name in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty"):
        assert plan[name] == getattr(sampling, name)
    assert plan["repetition_penalty"] == 1.2 and plan["seed"] == 2**63 + 5 and plan["n"] == 3
    defaults = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, sampling_defaults={"temperature": 0.3})
    assert plan_generation(request(), defaults, prompt_len=4).sampling["temperature"] == 0.3
    assert "temperature" not in plan_generation(request(), LIMITS, prompt_len=4).sampling


def test_greedy_with_several_sequences_is_rejected_like_vllm_does() -> None:
    with pytest.raises(InvalidArgument, match="temperature > 0"):
        plan_generation(request(sampling=Sampling(temperature=0.0, num_sequences=2)), LIMITS, prompt_len=4)


def test_a_seed_that_leaves_no_room_for_every_output_is_refused_before_acceptance() -> None:
    """vLLM seeds output i with seed + i, sent as an unsigned 64-bit integer: 2**64 fails in the engine."""
    last = Sampling(seed=2**64 - 1, num_sequences=2, temperature=1.0)
    with pytest.raises(InvalidArgument, match=r"below 2\*\*64"):
        plan_generation(request(sampling=last), LIMITS, prompt_len=4)
    fits = Sampling(seed=2**64 - 2, num_sequences=2, temperature=1.0)
    assert plan_generation(request(sampling=fits), LIMITS, prompt_len=4).sampling["n"] == 2
    one = Sampling(seed=2**64 - 1)
    assert plan_generation(request(sampling=one), LIMITS, prompt_len=4).sampling["seed"] == 2**64 - 1


def test_max_tokens_is_always_explicit() -> None:
    assert plan_generation(request(), LIMITS, prompt_len=4).sampling["max_tokens"] == 60
    plan = plan_generation(request(stopping=Stopping(max_tokens=7, min_tokens=2)), LIMITS, prompt_len=4)
    assert plan.sampling["max_tokens"] == 7 and plan.sampling["min_tokens"] == 2
    with pytest.raises(InvalidArgument, match="exceeds the context"):
        plan_generation(request(stopping=Stopping(max_tokens=61)), LIMITS, prompt_len=4)
    with pytest.raises(InvalidArgument, match="context is 64"):
        plan_generation(request(), LIMITS, prompt_len=64)


def test_the_model_s_max_new_tokens_is_the_budget_of_a_request_that_sets_none() -> None:
    """As vLLM's server does (``get_max_tokens``): the generation config's default, within the context."""
    defaults = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, default_max_tokens=16)
    assert plan_generation(request(), defaults, prompt_len=4).sampling["max_tokens"] == 16
    assert plan_generation(request(), defaults, prompt_len=56).sampling["max_tokens"] == 8
    explicit = request(stopping=Stopping(max_tokens=40))
    assert plan_generation(explicit, defaults, prompt_len=4).sampling["max_tokens"] == 40, "a default, not a limit"


def test_stops_and_include_stop_map_to_vllm() -> None:
    stopping = Stopping(
        max_tokens=5, stop_texts=("ab", "c"), stop_token_ids=(9,), ignore_eos=True, include_stop_in_output=True
    )
    plan = plan_generation(request(stopping=stopping), LIMITS, prompt_len=4).sampling
    assert plan["stop"] == ["ab", "c"] and plan["stop_token_ids"] == [9]
    assert plan["ignore_eos"] is True and plan["include_stop_str_in_output"] is True
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        plan_generation(request(stopping=Stopping(stop_token_ids=(512,))), LIMITS, prompt_len=4)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (None, {"logprobs": 0}),
        (CandidateSelection(TOP_N, top_n=3), {"logprobs": 3}),
        (CandidateSelection(ALL), {"logprobs": -1}),
        (CandidateSelection(IDS, token_ids=(4, 2)), {"logprob_token_ids": [4, 2]}),
    ],
)
def test_output_logprobs(selection: CandidateSelection | None, expected: dict[str, object]) -> None:
    plan = plan_generation(request(output_logprobs=LogprobRequest(selection)), LIMITS, prompt_len=4).sampling
    assert plan == plan | expected | {"flat_logprobs": True}


def test_too_many_explicit_candidates_are_rejected() -> None:
    selection = CandidateSelection(IDS, token_ids=tuple(range(129)))
    with pytest.raises(InvalidArgument, match="128"):
        plan_generation(request(output_logprobs=LogprobRequest(selection)), LIMITS, prompt_len=4)


def test_prompt_logprobs_top_n_and_all() -> None:
    top = request(prompt_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=2)), prompt_logprob_start=2)
    assert plan_generation(top, LIMITS, prompt_len=4).sampling["prompt_logprobs"] == 2
    every = request(prompt_logprobs=LogprobRequest(CandidateSelection(ALL)))
    assert plan_generation(every, LIMITS, prompt_len=4).sampling["prompt_logprobs"] == -1


def test_prompt_candidate_ids_use_vllm_rows_from_the_causal_start() -> None:
    wanted = LogprobRequest(CandidateSelection(IDS, token_ids=(3, 4)))
    native = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, token_id_logprobs=True)
    plan = plan_generation(request(prompt_logprobs=wanted, prompt_logprob_start=2), native, prompt_len=4).sampling
    assert plan["prompt_logprob_start"] == 1 and plan["prompt_logprob_token_ids"] == [[3, 4], [3, 4]]
    assert plan["prompt_logprobs"] == 0
    assert mapping.causal_row(0) == 0 and mapping.causal_row(1) == 0 and mapping.causal_row(5) == 4
    with pytest.raises(InvalidArgument, match="explicit prompt candidate"):
        plan_generation(request(prompt_logprobs=wanted), LIMITS, prompt_len=4)


@pytest.mark.parametrize(
    ("guidance", "expected"),
    [
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_SCHEMA, spec='{"type": "object"}'), {"json": '{"type": "object"}'}),
        (Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="[ab]+"), {"regex": "[ab]+"}),
        (Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, spec='root ::= "a"'), {"grammar": 'root ::= "a"'}),
        (Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec="{}"), {"structural_tag": "{}"}),
        (Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("yes", "no")), {"choice": ["yes", "no"]}),
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_OBJECT), {"json_object": True}),
    ],
)
def test_guided_decoding_maps_to_structured_outputs(guidance: Guidance, expected: dict[str, object]) -> None:
    assert mapping.guided_kwargs(guidance, "xgrammar") == expected


def test_a_request_backend_other_than_the_engines_is_rejected() -> None:
    guide = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a", backend="outlines")
    with pytest.raises(InvalidArgument, match="per engine"):
        mapping.guided_kwargs(guide, "xgrammar")
    assert mapping.guided_kwargs(Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a", backend="xgrammar"), "xgrammar")
    with pytest.raises(InvalidArgument, match="without a structured-outputs backend"):
        mapping.guided_kwargs(guide, None)


def test_a_guide_with_ignore_eos_is_refused() -> None:
    """vLLM stops masking once a grammar is complete, so the output would run on past the guide unconstrained."""
    limits = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, guided_backend="xgrammar")
    guided = request(guidance=Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("yes", "no")))
    assert plan_generation(guided, limits, prompt_len=4).structured_outputs == {"choice": ["yes", "no"]}
    with pytest.raises(InvalidArgument, match="ignore_eos"):
        plan_generation(replace(guided, stopping=Stopping(ignore_eos=True)), limits, prompt_len=4)


def test_priority_direction_is_reversed_for_vllm() -> None:
    limits = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, priority_scheduling=True)
    assert plan_generation(request(priority=5), limits, prompt_len=4).priority == -5
    assert plan_generation(request(), limits, prompt_len=4).priority == 0
    with pytest.raises(InvalidArgument, match="priority scheduler"):
        plan_generation(request(priority=5), LIMITS, prompt_len=4)


def test_prefix_cache_bypass_reads_no_cache_and_is_left_to_vllm_otherwise() -> None:
    assert plan_generation(request(bypass_prefix_cache=True), LIMITS, prompt_len=4).sampling[
        "skip_reading_prefix_cache"
    ]
    assert "skip_reading_prefix_cache" not in plan_generation(request(), LIMITS, prompt_len=4).sampling


def test_prefill_engines_ask_the_connector_to_keep_kv_for_a_remote_decode() -> None:
    limits = EngineLimits(max_model_len=64, vocab_size=512, max_logprobs=20, role=pb.ENGINE_ROLE_PREFILL)
    plan = plan_generation(request(stopping=Stopping(max_tokens=9)), limits, prompt_len=4).sampling
    assert plan["max_tokens"] == 1
    assert plan["extra_args"] == {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    several = Sampling(num_sequences=3, temperature=1.0)
    assert "n" not in plan_generation(request(sampling=several), limits, prompt_len=4).sampling, (
        "one prefill, one handoff: the decode engine samples the outputs"
    )


DECODE = EngineLimits(
    max_model_len=64, vocab_size=512, max_logprobs=20, role=pb.ENGINE_ROLE_DECODE, transfer_backend="NixlConnector"
)


def test_decode_requests_pass_the_prefill_params_back_with_their_int_types() -> None:
    attributes = {"remote_port": 5600.0, "remote_block_ids": [1.0, 2.0], "remote_host": "p0", "do_remote_prefill": True}
    session = KvSession(session_id="s", transfer_backend="NixlConnector", attributes=attributes)
    plan = plan_generation(request(kv_session=session), DECODE, prompt_len=4).sampling
    params = plan["extra_args"]["kv_transfer_params"]
    assert params == {"remote_port": 5600, "remote_block_ids": [1, 2], "remote_host": "p0", "do_remote_prefill": True}
    assert type(params["remote_port"]) is int and params["do_remote_prefill"] is True
    assert mapping.restore_numbers(0.5) == 0.5


@pytest.mark.parametrize(
    ("session", "match"),
    [
        (KvSession("s", "bogus", attributes={"do_remote_prefill": True}), "'bogus' is not this engine's KV connector"),
        (KvSession("s", "", attributes={"do_remote_prefill": True}), "'' is not this engine's KV connector"),
        (KvSession("s", "NixlConnector"), "no transfer parameters"),  # vLLM would prefill it locally
    ],
)
def test_decode_validates_the_session_and_its_transfer_backend(session: KvSession, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        plan_generation(request(kv_session=session), DECODE, prompt_len=4)


def test_prefill_session_keeps_the_final_transfer_params() -> None:
    session = mapping.prefill_session("r", {"remote_port": 5600}, transfer_backend="NixlConnector", dp_rank=1)
    assert session == KvSession("r", "NixlConnector", (), 1, {"remote_port": 5600})


def test_eos_ids_and_sampling_defaults_from_the_model_config() -> None:
    assert mapping.eos_token_ids(2, {"eos_token_id": [2, 7]}) == (2, 7)
    assert mapping.eos_token_ids(None, {"eos_token_id": 3}) == (3,)
    assert mapping.sampling_defaults({"temperature": 0.6, "max_new_tokens": 9}) == {"temperature": 0.6}


def test_multimodal_prompts_leave_the_remaining_context_to_vllm() -> None:
    assert plan_generation(request(), LIMITS, prompt_len=None).sampling["max_tokens"] is None
    budget = plan_generation(request(stopping=Stopping(max_tokens=9)), LIMITS, prompt_len=None)
    assert budget.sampling["max_tokens"] == 9
