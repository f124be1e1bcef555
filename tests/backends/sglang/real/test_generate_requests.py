"""Every request shape the driver maps, admitted by SGLang's real ``TokenizerManager`` (tiny Llama, CPU).

Each test plans a request with the driver against the limits it reads from the real tokenizer
manager, submits every output's ``GenerateReqInput`` as ``engine.py`` does, and checks the
``TokenizedGenerateReqInput`` SGLang would hand its scheduler: SGLang accepts it, and its
``SamplingParams`` (normalised and verified by SGLang itself) mean what the driver intends.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, mapping
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

from .admission import admit, admit_all, plan, submitted

PROMPT = [5, 6, 7, 8]
TOP_N, IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


@pytest.fixture(scope="module")
def limits(tokenizer_manager: Any, internal_state: dict[str, Any]) -> mapping.EngineLimits:
    """The driver's view of this engine, read from SGLang's own objects as ``engine._describe`` reads it."""
    return capabilities.engine_limits(capabilities.engine_state(tokenizer_manager, internal_state))


def request(**fields: Any) -> GenerationRequest:
    fields.setdefault("prompt_token_ids", PROMPT)
    return GenerationRequest(request_id="r", model="tiny", **fields)


async def sampling(tokenizer_manager: Any, limits: mapping.EngineLimits, **fields: Any) -> Any:
    """The verified ``SamplingParams`` of output 0."""
    (tokenized, *_) = await admit_all(tokenizer_manager, request(**fields), limits)
    return tokenized.sampling_params


def test_the_limits_are_sglangs(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    assert limits.vocab_size == tokenizer_manager.model_config.vocab_size == 512
    assert limits.eos_token_ids == (tokenizer_manager.tokenizer.eos_token_id,)
    assert limits.max_prompt == tokenizer_manager.max_req_input_len - 1
    assert limits.grammar_backend == "xgrammar", "SGLang resolves an unset grammar backend to xgrammar"


async def test_a_token_prompt_with_no_budget_gets_the_rest_of_the_context(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    (tokenized,) = await admit_all(tokenizer_manager, request(), limits)
    assert list(tokenized.input_ids) == PROMPT
    assert tokenized.sampling_params.max_new_tokens == limits.max_context - len(PROMPT)
    assert tokenized.stream is True
    assert not tokenized.return_logprob


async def test_a_text_prompt_is_tokenized_as_sglang_tokenizes_it(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    text = "the quick brown fox"
    (tokenized,) = await admit_all(tokenizer_manager, request(prompt=text, prompt_token_ids=None), limits)
    reference = await admit(tokenizer_manager, {"text": text, "rid": "reference", "stream": True})
    assert list(tokenized.input_ids) == list(reference.input_ids), "the driver counts the tokens SGLang runs"


async def test_sampling_knobs_keep_their_values(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    knobs = Sampling(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.05,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        repetition_penalty=1.3,
    )
    params = await sampling(tokenizer_manager, limits, sampling=knobs)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 5, 0.05)
    assert (params.frequency_penalty, params.presence_penalty, params.repetition_penalty) == (0.5, -0.5, 1.3)


async def test_unset_knobs_are_sglangs_defaults(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    params = await sampling(tokenizer_manager, limits)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, TOP_K_ALL, 0.0)
    assert (params.frequency_penalty, params.presence_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)


@pytest.mark.parametrize("top_k", [0, -1])
async def test_openengines_top_k_off_is_the_whole_vocabulary(
    tokenizer_manager: Any, limits: mapping.EngineLimits, top_k: int
) -> None:
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    # The contract layer turns -1 into 0 (no limit); the driver sends SGLang's -1 for it.
    params = await sampling(tokenizer_manager, limits, sampling=Sampling(top_k=max(top_k, 0)))
    assert params.top_k == TOP_K_ALL


async def test_temperature_zero_is_sglangs_greedy(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    params = await sampling(tokenizer_manager, limits, sampling=Sampling(temperature=0.0, top_k=0))
    assert params.top_k == 1, "SGLang samples greedily as top_k=1"


async def test_stopping(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    stopping = Stopping(
        max_tokens=20, stop_texts=("fox", "lazy dog"), stop_token_ids=(9, 10), include_stop_in_output=True
    )
    params = await sampling(tokenizer_manager, limits, stopping=stopping)
    assert (params.max_new_tokens, params.min_new_tokens) == (20, 0)
    assert params.stop_strs == ["fox", "lazy dog"]
    longest = max(len(tokenizer_manager.tokenizer.encode(s, add_special_tokens=False)) for s in stopping.stop_texts)
    assert params.stop_str_max_len == longest
    assert params.stop_token_ids == {9, 10}
    assert params.no_stop_trim is True and params.ignore_eos is False


async def test_min_tokens_hold_back_stop_tokens(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    params = await sampling(
        tokenizer_manager, limits, stopping=Stopping(max_tokens=20, min_tokens=3, stop_token_ids=(9,))
    )
    assert (params.min_new_tokens, params.stop_token_ids) == (3, {9})


async def test_ignore_eos_sends_no_stop_token_ids(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    params = await sampling(tokenizer_manager, limits, stopping=Stopping(stop_token_ids=(9,), ignore_eos=True))
    assert params.ignore_eos is True
    assert params.stop_token_ids is None, "the driver watches for them itself (outputs.RequestStream)"


async def test_the_output_budget_at_the_context_limit_is_admitted(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    prompt = list(range(3, 3 + limits.max_prompt))
    budget = limits.max_context - len(prompt)
    (tokenized,) = await admit_all(
        tokenizer_manager, request(prompt_token_ids=prompt, stopping=Stopping(max_tokens=budget)), limits
    )
    assert len(tokenized.input_ids) == limits.max_prompt
    assert tokenized.sampling_params.max_new_tokens == budget


def test_the_longest_prompt_is_the_longest_sglangs_scheduler_admits(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    """``validate_input_length`` (``managers/utils.py``) is the scheduler's check of every request."""
    from types import SimpleNamespace

    from sglang.srt.managers.utils import validate_input_length

    longest = SimpleNamespace(origin_input_ids=[3] * limits.max_prompt)
    assert validate_input_length(longest, tokenizer_manager.max_req_input_len, False) is None  # type: ignore[arg-type]
    longer = SimpleNamespace(origin_input_ids=[3] * (limits.max_prompt + 1))
    assert validate_input_length(longer, tokenizer_manager.max_req_input_len, False)  # type: ignore[arg-type]
    with pytest.raises(Exception, match=f"at most {limits.max_prompt}"):
        plan(tokenizer_manager, request(prompt_token_ids=longer.origin_input_ids), limits)


async def test_output_logprobs_with_top_candidates(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    selection = CandidateSelection(mode=TOP_N, top_n=3)
    (tokenized,) = await admit_all(
        tokenizer_manager, request(output_logprobs=LogprobRequest(candidates=selection)), limits
    )
    assert tokenized.return_logprob is True
    assert tokenized.top_logprobs_num == 3
    assert tokenized.logprob_start_len == -1, "output logprobs only"
    assert tokenized.token_ids_logprob is None


async def test_prompt_logprobs_from_a_position_with_explicit_ids(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    selection = CandidateSelection(mode=IDS, token_ids=(7, 11))
    req = request(prompt_logprobs=LogprobRequest(candidates=selection), prompt_logprob_start=2)
    (tokenized,) = await admit_all(tokenizer_manager, req, limits)
    assert tokenized.return_logprob is True
    assert tokenized.logprob_start_len == 1, "SGLang's first returned prompt entry has no logprob"
    assert list(tokenized.token_ids_logprob) == [7, 11]
    assert tokenized.top_logprobs_num == 0


async def test_candidates_stop_at_the_bound_all_of_a_larger_vocabulary_is_refused(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    """SGLang takes any ``top_logprobs_num`` and detokenizes every candidate on the gateway's loop."""
    most = CandidateSelection(mode=TOP_N, top_n=mapping.MAX_CANDIDATES)
    (tokenized,) = await admit_all(tokenizer_manager, request(output_logprobs=LogprobRequest(candidates=most)), limits)
    assert tokenized.top_logprobs_num == mapping.MAX_CANDIDATES < tokenizer_manager.model_config.vocab_size
    every = request(output_logprobs=LogprobRequest(candidates=CandidateSelection(mode=ALL)))
    with pytest.raises(InvalidArgument, match="all 512 vocabulary entries"):
        await admit_all(tokenizer_manager, every, limits)


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
LEGACY_TAG = json.dumps(
    {
        "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
        "triggers": ["<f>"],
    }
)


@pytest.mark.parametrize(
    ("guidance", "field", "value"),
    [
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_SCHEMA, spec=SCHEMA), "json_schema", SCHEMA),
        (Guidance(pb.GUIDED_DECODING_MODE_REGEX, spec="[0-9]+"), "regex", "[0-9]+"),
        (Guidance(pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR, spec='root ::= "a"'), "ebnf", 'root ::= "a"'),
        (Guidance(pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG, spec=LEGACY_TAG), "structural_tag", LEGACY_TAG),
        (Guidance(pb.GUIDED_DECODING_MODE_CHOICE, choices=("yes", "no.")), "regex", r"(yes|no\.)"),
        (Guidance(pb.GUIDED_DECODING_MODE_JSON_OBJECT), "json_schema", mapping.JSON_OBJECT_SCHEMA),
    ],
)
async def test_each_guide_is_the_one_grammar_sglang_compiles(
    tokenizer_manager: Any, limits: mapping.EngineLimits, guidance: Guidance, field: str, value: str
) -> None:
    params = await sampling(tokenizer_manager, limits, guidance=guidance)
    grammars = {name: getattr(params, name) for name in ("json_schema", "regex", "ebnf", "structural_tag")}
    assert grammars == {name: value if name == field else None for name in grammars}


async def test_seeded_outputs_carry_distinct_int64_seeds(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    deterministic = replace(limits, deterministic=True)
    seed = (1 << 64) - 2  # the largest OpenEngine seeds wrap into SGLang's signed range
    req = request(sampling=Sampling(seed=seed, num_sequences=3))
    outputs = await admit_all(tokenizer_manager, req, deterministic)
    seeds = [tokenized.sampling_params.sampling_seed for tokenized in outputs]
    assert seeds == [-2, -1, 0]
    assert len({tokenized.rid for tokenized in outputs}) == 3


async def test_unseeded_outputs_in_deterministic_mode_start_from_sglangs_default_seed(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    outputs = await admit_all(
        tokenizer_manager, request(sampling=Sampling(num_sequences=2)), replace(limits, deterministic=True)
    )
    assert [tokenized.sampling_params.sampling_seed for tokenized in outputs] == [42, 43]


async def test_several_outputs_are_single_sglang_requests(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    selection = CandidateSelection(mode=TOP_N, top_n=2)
    req = request(
        sampling=Sampling(num_sequences=2),
        output_logprobs=LogprobRequest(candidates=selection),
        prompt_logprobs=LogprobRequest(),
    )
    first, second = await admit_all(tokenizer_manager, req, limits)
    assert first.sampling_params.n == second.sampling_params.n == 1
    assert (first.logprob_start_len, second.logprob_start_len) == (0, -1), "prompt logprobs once"


async def test_routing_salt_and_priority(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    priority = replace(limits, priority_scheduling=True, low_priority_values_first=True)
    req = request(cache_salt="tenant-a", data_parallel_rank=0, priority=7)
    (tokenized,) = await admit_all(tokenizer_manager, req, priority)
    assert tokenized.cache_salt == "tenant-a"
    assert tokenized.priority == -7


async def test_a_decode_request_carries_its_bootstrap(tokenizer_manager: Any, limits: mapping.EngineLimits) -> None:
    decode = replace(limits, role=pb.ENGINE_ROLE_DECODE, transfer_backend="mooncake")
    session = KvSession(
        session_id="s",
        transfer_backend="mooncake",
        attributes={"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998.0, "bootstrap_room": 12345.0},
    )
    (tokenized,) = await admit_all(tokenizer_manager, request(kv_session=session), decode)
    assert (tokenized.bootstrap_host, tokenized.bootstrap_port, tokenized.bootstrap_room) == ("10.0.0.1", 8998, 12345)


async def test_a_prefill_request_carries_the_room_it_hands_to_decode(
    tokenizer_manager: Any, limits: mapping.EngineLimits
) -> None:
    prefill = replace(limits, role=pb.ENGINE_ROLE_PREFILL, transfer_backend="mooncake", dp_ranks=2)
    generation, _ = plan(tokenizer_manager, request(), prefill)
    session = mapping.prefill_session("r", host="h", port=8998, room=(1 << 53) - 1, limits=prefill, routed_rank=None)
    (fields,) = submitted(generation, "r")
    tokenized = await admit(tokenizer_manager, {**fields, **mapping.prefill_kwargs(session)})
    assert (tokenized.bootstrap_host, tokenized.bootstrap_port, tokenized.bootstrap_room) == ("h", 8998, (1 << 53) - 1)


def test_a_multimodal_prompt_is_one_sglang_request_with_its_media(limits: mapping.EngineLimits) -> None:
    """(The tiny Llama takes no media: SGLang's normalisation of the request is what is checked.)"""
    from openengine_gateway.spi import Media
    from sglang.srt.managers.io_struct import GenerateReqInput

    media = (
        Media(pb.MODALITY_IMAGE, url="https://x/cat.png"),
        Media(pb.MODALITY_IMAGE, raw_bytes=b"\x89PNG", mime_type="image/png"),
        Media(pb.MODALITY_VIDEO, url="https://x/clip.mp4"),
        Media(pb.MODALITY_AUDIO, data_uri="data:audio/wav;base64,UklGRg=="),
    )
    req = GenerationRequest(request_id="r", model="tiny", prompt="what is this", media=media)
    generation = mapping.plan_generation(req, limits, input_ids=None)
    (fields,) = submitted(generation, "r")
    request = GenerateReqInput(**fields)
    request.normalize_batch_and_arguments()
    assert (request.is_single, request.text) == (True, "what is this")
    assert request.image_data == ["https://x/cat.png", "data:image/png;base64,iVBORw=="]
    assert (request.video_data, request.audio_data) == (["https://x/clip.mp4"], ["data:audio/wav;base64,UklGRg=="])
    assert request.sampling_params["max_new_tokens"] is None, "SGLang's scheduler bounds it by the context"
