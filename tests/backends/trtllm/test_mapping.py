"""``GenerationRequest`` → TensorRT-LLM parameters, and the prefill ↔ decode handoff."""

from __future__ import annotations

import base64
import dataclasses
import re
from types import SimpleNamespace
from typing import Any

import pytest
from openengine_backends.trtllm.capabilities import HANDOFF_FIELDS_1_2, EngineFeatures
from openengine_backends.trtllm.mapping import (
    choice_regex,
    guided_kwargs,
    handoff_params,
    plan_generation,
    prefill_session,
    trt_priority,
)
from openengine_backends.trtllm.sampling import TORCH_SAMPLER_KNOBS, TRTLLM_SAMPLER_KNOBS, sampling_defaults
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

FEATURES = EngineFeatures(max_seq_len=64, max_batch_size=8, guided_backend="xgrammar", eos_token_ids=(2,))
TRTLLM_SAMPLER = dataclasses.replace(FEATURES, sampler_knobs=TRTLLM_SAMPLER_KNOBS)
LATER_HANDOFF = HANDOFF_FIELDS_1_2 | {"ctx_dp_rank", "ctx_info_endpoint", "schedule_style", "disagg_request_id"}
"""The ``DisaggregatedParams`` fields of a release after 1.2."""
TOP_N = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id="r", model="m", prompt_token_ids=[5, 6, 7], **fields)


def test_sampling_knobs_pass_through_to_a_sampler_that_applies_them() -> None:
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=0, min_p=0.1, seed=3, repetition_penalty=1.1)
    plan = plan_generation(request(sampling=sampling), TRTLLM_SAMPLER, prompt_len=3)
    assert plan.sampling == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "min_p": 0.1,
        "seed": 3,
        "repetition_penalty": 1.1,
        "max_tokens": 61,
        "ignore_eos": False,
        "include_stop_str_in_output": False,
    }


@pytest.mark.parametrize(
    "knob",
    [{"min_p": 0.1}, {"seed": 3}, {"repetition_penalty": 1.1}, {"presence_penalty": 0.5}, {"frequency_penalty": -1.0}],
    ids=lambda knob: next(iter(knob)),
)
def test_knobs_torch_sampler_ignores_are_refused(knob: dict[str, Any]) -> None:
    """TensorRT-LLM 1.2's ``TorchSampler`` reads temperature, top-k and top-p only (``sampler.py``)."""
    assert FEATURES.sampler_knobs == TORCH_SAMPLER_KNOBS
    with pytest.raises(InvalidArgument, match=f"sampling.{next(iter(knob))}.*TRTLLMSampler"):
        plan_generation(request(sampling=Sampling(**knob)), FEATURES, prompt_len=3)


def test_neutral_values_of_ignored_knobs_are_accepted() -> None:
    neutral = Sampling(min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    sampling = plan_generation(request(sampling=neutral), FEATURES, prompt_len=3).sampling
    assert (sampling["min_p"], sampling["repetition_penalty"]) == (0.0, 1.0)


def test_unset_knobs_sample_at_temperature_one_not_greedily() -> None:
    """TensorRT-LLM decodes greedily when nothing is set; vLLM and SGLang sample at temperature 1."""
    plan = plan_generation(request(), FEATURES, prompt_len=3)
    assert (plan.sampling["temperature"], plan.sampling["top_p"], plan.sampling["top_k"]) == (1.0, 1.0, 0)
    greedy = plan_generation(request(sampling=Sampling(temperature=0.0)), FEATURES, prompt_len=3)
    assert greedy.sampling["temperature"] == 0.0


def test_unset_knobs_take_the_models_generation_config_defaults_the_sampler_applies() -> None:
    config = {"temperature": 0.6, "top_k": 20, "repetition_penalty": 1.05}
    model = dataclasses.replace(FEATURES, sampling=sampling_defaults(config, TORCH_SAMPLER_KNOBS))
    plan = plan_generation(request(sampling=Sampling(top_k=5)), model, prompt_len=3)
    assert (plan.sampling["temperature"], plan.sampling["top_p"], plan.sampling["top_k"]) == (0.6, 1.0, 5)
    assert "repetition_penalty" not in plan.sampling, "a default TorchSampler cannot apply is dropped, not refused"


def test_min_tokens_with_stop_tokens_is_refused() -> None:
    """TensorRT-LLM's ``_apply_min_length_penalty`` masks the end id alone: a stop token could end it early."""
    both = Stopping(max_tokens=8, min_tokens=3, stop_token_ids=(9,))
    with pytest.raises(InvalidArgument, match="min_tokens with stop token ids"):
        plan_generation(request(stopping=both), FEATURES, prompt_len=3)
    alone = plan_generation(request(stopping=Stopping(max_tokens=8, min_tokens=3)), FEATURES, prompt_len=3)
    assert alone.sampling["min_tokens"] == 3
    prefill = dataclasses.replace(FEATURES, role=pb.ENGINE_ROLE_PREFILL)
    assert plan_generation(request(stopping=both), prefill, prompt_len=3).sampling["max_tokens"] == 1


def test_max_tokens_is_always_set_and_fits_the_context() -> None:
    assert plan_generation(request(), FEATURES, prompt_len=3).sampling["max_tokens"] == 61
    given = plan_generation(request(stopping=Stopping(max_tokens=5, min_tokens=2)), FEATURES, prompt_len=3)
    assert given.sampling["max_tokens"] == 5 and given.sampling["min_tokens"] == 2
    with pytest.raises(InvalidArgument, match="exceeds the context"):
        plan_generation(request(stopping=Stopping(max_tokens=62)), FEATURES, prompt_len=3)
    with pytest.raises(InvalidArgument, match="context is 64"):
        plan_generation(request(), FEATURES, prompt_len=64)
    unknown = dataclasses.replace(FEATURES, max_seq_len=None)
    with pytest.raises(InvalidArgument, match="max_tokens is required"):
        plan_generation(request(), unknown, prompt_len=3)


def test_stop_tokens_go_to_tensorrt_llm_but_stop_strings_do_not() -> None:
    stopping = Stopping(stop_texts=("\n\n",), stop_token_ids=(9, 4), include_stop_in_output=True, ignore_eos=True)
    sampling = plan_generation(request(stopping=stopping), FEATURES, prompt_len=3).sampling
    assert sampling["stop_token_ids"] == [9, 4] and "stop" not in sampling
    assert sampling["include_stop_str_in_output"] is True and sampling["ignore_eos"] is True


def test_output_logprobs_ask_for_rows_that_hold_every_sampled_token() -> None:
    """``TorchSampler`` returns the top-k rows only (1.2-period ``sampler.py``): greedy decoding and
    top-k sampling sample within them; other sampling could sample a token no row holds."""

    def asked(sampling: Sampling, top_n: int = 0, features: EngineFeatures = FEATURES) -> int:
        wanted = LogprobRequest(CandidateSelection(TOP_N, top_n=top_n) if top_n else None)
        return int(
            plan_generation(request(sampling=sampling, output_logprobs=wanted), features, prompt_len=3).sampling[
                "logprobs"
            ]
        )

    greedy = Sampling(temperature=0.0)
    assert asked(greedy) == 1 and asked(greedy, top_n=5) == 5
    assert asked(Sampling(top_k=8)) == 8 and asked(Sampling(top_k=2), top_n=5) == 5
    speculative = dataclasses.replace(FEATURES, max_top_logprobs=1, sampled_logprob_only=True)
    assert asked(Sampling(), features=speculative) == 1  # its samplers return the sampled token's logprob
    for unbounded in (Sampling(), Sampling(top_p=0.5), Sampling(top_k=21)):
        with pytest.raises(InvalidArgument, match="top_k between 1 and 20"):
            asked(unbounded)


def test_an_engine_without_a_tokenizer_gets_its_end_id() -> None:
    bare = dataclasses.replace(FEATURES, has_tokenizer=False)
    assert plan_generation(request(), bare, prompt_len=3).sampling["end_id"] == 2
    assert "end_id" not in plan_generation(request(), FEATURES, prompt_len=3).sampling


def test_guides_map_to_guided_decoding_params_and_choices_to_a_regex() -> None:
    json_schema = Guidance(pb.GUIDED_DECODING_MODE_JSON_SCHEMA, spec='{"type": "object"}')
    assert guided_kwargs(json_schema, "xgrammar") == {"json": '{"type": "object"}'}
    assert guided_kwargs(Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, spec="root ::= x"), "xgrammar") == {
        "grammar": "root ::= x"
    }
    assert guided_kwargs(Guidance(pb.GUIDED_DECODING_MODE_JSON_OBJECT), "llguidance") == {"json_object": True}
    tag = Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec="{}")
    assert guided_kwargs(tag, "xgrammar") == {"structural_tag": "{}"}
    choice = Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("a.b", "c|d", "(x)", "plain text"))
    assert guided_kwargs(choice, "xgrammar") == {"regex": choice_regex(choice.choices)}


def test_the_choice_regex_matches_each_choice_and_nothing_else() -> None:
    choices = ("1+1=2", "a.b", "[x]", "c|d", "{n}", "back\\slash", "ok ?", "$^/")
    pattern = re.compile(choice_regex(choices))
    assert all(pattern.fullmatch(choice) for choice in choices)
    assert not pattern.fullmatch("axb") and not pattern.fullmatch("c") and not pattern.fullmatch("11=2")


def test_guidance_needs_the_engines_backend() -> None:
    regex = Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="a+")
    with pytest.raises(InvalidArgument, match="without a guided_decoding_backend"):
        guided_kwargs(regex, None)
    with pytest.raises(InvalidArgument, match="selects the backend per engine"):
        guided_kwargs(dataclasses.replace(regex, backend="llguidance"), "xgrammar")
    assert guided_kwargs(dataclasses.replace(regex, backend="xgrammar"), "xgrammar") == {"regex": "a+"}


def test_priority_maps_into_zero_one_keeping_the_order() -> None:
    values = [-(2**31), -3000, -2, -1, 0, 1, 2, 1000, 2**31 - 1]
    mapped = [trt_priority(p) for p in values]
    assert mapped == sorted(mapped) and len(set(mapped)) == len(mapped)
    assert trt_priority(0) == 0.5 and all(0 < m < 1 for m in mapped)
    with pytest.raises(InvalidArgument, match="does not schedule by priority"):
        plan_generation(request(priority=1), FEATURES, prompt_len=3)
    ranked = dataclasses.replace(FEATURES, priority=True)
    assert plan_generation(request(priority=-1), ranked, prompt_len=3).priority == 0.25


def test_a_data_parallel_rank_pins_only_on_attention_dp() -> None:
    assert plan_generation(request(data_parallel_rank=0), FEATURES, prompt_len=3).attention_dp_rank is None
    adp = dataclasses.replace(FEATURES, attention_dp=True, tensor_parallel_size=4)
    assert plan_generation(request(data_parallel_rank=3), adp, prompt_len=3).attention_dp_rank == 3


def test_a_prefill_engine_runs_context_only_with_one_token() -> None:
    prefill = dataclasses.replace(FEATURES, role=pb.ENGINE_ROLE_PREFILL)
    plan = plan_generation(request(stopping=Stopping(max_tokens=30, min_tokens=5)), prefill, prompt_len=3)
    assert plan.disaggregated == {"request_type": "context_only"} and plan.sampling["max_tokens"] == 1
    assert "min_tokens" not in plan.sampling and plan.sampling["include_stop_str_in_output"] is False
    with pytest.raises(InvalidArgument, match="context is 64"):
        plan_generation(request(), prefill, prompt_len=64)
    assert plan_generation(request(), FEATURES, prompt_len=3).disaggregated is None


def handoff(**fields: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "request_type": "context_only",
        "first_gen_tokens": [42],
        "ctx_request_id": 2**60 + 7,
        "opaque_state": b"\x00\xffstate",
        "draft_tokens": None,
        "disagg_request_id": 2**62 + 1,
        "ctx_dp_rank": 1,
        "ctx_info_endpoint": "tcp://ctx.example:5555",
        "schedule_style": None,
    }
    return SimpleNamespace(**{**values, **fields})


def struct_round_trip(session: KvSession) -> KvSession:
    """What a decode engine receives: the session through a KvSessionRef (numbers become doubles)."""
    from openengine_gateway.contract.generation import kv_session_from_proto, kv_session_to_proto

    return kv_session_from_proto(kv_session_to_proto(session))


def test_the_handoff_survives_the_wire_types_preserved() -> None:
    session = prefill_session(handoff(), transfer_backend="ucx")
    assert session.session_id == str(2**60 + 7) and session.dp_rank == 1
    assert session.endpoints[0].host == "ctx.example" and session.endpoints[0].port == 5555
    params = handoff_params(struct_round_trip(session), LATER_HANDOFF)
    assert params == {
        "request_type": "generation_only",
        "ctx_request_id": 2**60 + 7,
        "ctx_dp_rank": 1,
        "first_gen_tokens": [42],
        "disagg_request_id": 2**62 + 1,
        "opaque_state": b"\x00\xffstate",
        "ctx_info_endpoint": "tcp://ctx.example:5555",
    }
    plan = plan_generation(
        request(kv_session=struct_round_trip(session)),
        dataclasses.replace(FEATURES, role=pb.ENGINE_ROLE_DECODE, handoff_fields=LATER_HANDOFF),
        prompt_len=3,
    )
    assert plan.disaggregated == params


def test_tensorrt_llm_1_2_gets_only_the_handoff_fields_its_class_has() -> None:
    """1.2's ``DisaggregatedParams`` has no ``ctx_dp_rank``, ``ctx_info_endpoint``, ``schedule_style``,
    ``disagg_request_id``: passing one is a ``TypeError``."""
    later = struct_round_trip(prefill_session(handoff(schedule_style=1), transfer_backend="ucx"))
    params = handoff_params(later, HANDOFF_FIELDS_1_2)
    assert params == {
        "request_type": "generation_only",
        "ctx_request_id": 2**60 + 7,
        "first_gen_tokens": [42],
        "opaque_state": b"\x00\xffstate",
    }
    endpoint_only = dataclasses.replace(later, attributes={**later.attributes, "opaque_state": ""})
    with pytest.raises(InvalidArgument, match="no opaque_state this TensorRT-LLM takes"):
        handoff_params(endpoint_only, HANDOFF_FIELDS_1_2)


def test_a_context_rank_is_passed_only_when_known() -> None:
    unranked = prefill_session(handoff(ctx_dp_rank=None), transfer_backend="ucx")
    assert "ctx_dp_rank" not in handoff_params(struct_round_trip(unranked), LATER_HANDOFF)
    explicit_zero = prefill_session(handoff(ctx_dp_rank=0), transfer_backend="ucx")
    assert handoff_params(struct_round_trip(explicit_zero), LATER_HANDOFF)["ctx_dp_rank"] == 0  # reported: kept
    by_ref = dataclasses.replace(struct_round_trip(unranked), dp_rank=3)  # a KvSessionRef naming its rank
    assert handoff_params(by_ref, LATER_HANDOFF)["ctx_dp_rank"] == 3


def test_a_session_tensorrt_llm_could_not_resolve_is_refused() -> None:
    state = base64.b64encode(b"s").decode()
    fields = LATER_HANDOFF
    with pytest.raises(InvalidArgument, match="not a TensorRT-LLM handoff"):
        handoff_params(KvSession("not-a-number", attributes={"opaque_state": state, "first_gen_tokens": [1.0]}), fields)
    with pytest.raises(InvalidArgument, match="no opaque_state or ctx_info_endpoint"):
        handoff_params(KvSession("5", attributes={"first_gen_tokens": [1.0]}), fields)
    with pytest.raises(InvalidArgument, match=r"no first_gen_tokens \(TensorRT-LLM resumes"):
        handoff_params(KvSession("5", attributes={"opaque_state": state}), fields)
    with pytest.raises(InvalidArgument, match="does not take: kv_transfer_params"):
        handoff_params(KvSession("5", attributes={"kv_transfer_params": {}}), fields)
    with pytest.raises(InvalidArgument, match="not a TensorRT-LLM handoff"):
        handoff_params(KvSession("5", attributes={"opaque_state": "!!", "first_gen_tokens": [1.0]}), fields)


def test_a_session_from_tensorrt_llms_own_servicer_is_taken() -> None:
    """``grpc/openengine/disagg.py`` adds ``ctx_usage`` and ``first_gen_log_probs`` (floats, or
    ``[token_id, logprob, rank]`` triples); both reach a ``DisaggregatedParams`` that has the field."""
    state = base64.b64encode(b"s").decode()
    attributes = {
        "opaque_state": state,
        "first_gen_tokens": [7.0],
        "ctx_usage": {"prompt_tokens": 3.0, "completion_tokens": 1.0},
        "first_gen_log_probs": [[[7.0, -0.25, 1.0], [9.0, -1.5, 2.0]], -0.5],
    }
    servicer = struct_round_trip(KvSession("5", attributes=attributes))
    later = LATER_HANDOFF | {"first_gen_log_probs", "ctx_usage"}
    params = handoff_params(servicer, later)
    assert params["ctx_usage"] == {"prompt_tokens": 3, "completion_tokens": 1}
    assert params["first_gen_log_probs"] == [{7: (-0.25, 1), 9: (-1.5, 2)}, -0.5]
    assert set(handoff_params(servicer, HANDOFF_FIELDS_1_2)) == {
        "request_type",
        "ctx_request_id",
        "first_gen_tokens",
        "opaque_state",
    }
    back = prefill_session(
        SimpleNamespace(
            ctx_request_id=5,
            opaque_state=b"s",
            first_gen_tokens=[7],
            ctx_usage={"prompt_tokens": 3},
            first_gen_log_probs=[{7: SimpleNamespace(logprob=-0.25, rank=1)}],
        ),
        transfer_backend="ucx",
    )
    assert back.attributes["ctx_usage"] == {"prompt_tokens": 3}
    assert back.attributes["first_gen_log_probs"] == [[[7, -0.25, 1]]]  # as the servicer writes them
