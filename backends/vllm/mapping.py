"""``GenerationRequest`` → vLLM request parameters: pure functions, no vLLM import.

The results are plain values: keyword arguments for ``vllm.SamplingParams`` and
``StructuredOutputsParams``, and the prompt dictionary vLLM's renderer takes. ``engine.py``
builds the vLLM objects from them. Everything the engine cannot honour is rejected here with
``InvalidArgument`` before the request is accepted, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import CandidateSelection, GenerationRequest, Guidance, KvSession, LogprobRequest, Sampling

MAX_LOGPROB_TOKEN_IDS = 128
"""vLLM's cap on ``SamplingParams.logprob_token_ids`` (``vllm.sampling_params``)."""

_GUIDE_FIELDS = {
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA: "json",
    pb.GUIDED_DECODING_MODE_REGEX: "regex",
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR: "grammar",
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG: "structural_tag",
}


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What per-request mapping needs to know about the started engine (from its config)."""

    max_model_len: int
    vocab_size: int
    max_logprobs: int
    """vLLM's ``max_logprobs`` resolved: -1 (unlimited) becomes the vocabulary size."""
    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    """The model's generation-config defaults, as vLLM's own server applies them."""
    default_max_tokens: int | None = None
    """The generation config's ``max_new_tokens``: the budget of a request that sets none (vLLM's
    server uses it so, ``get_max_tokens``), within the context."""
    priority_scheduling: bool = False
    guided_backend: str | None = None
    """The engine's structured-outputs backend; None when structured outputs are unavailable."""
    token_id_logprobs: bool = False
    """The engine scores explicit candidate ids right (runner V2; see ``capabilities.EngineFeatures``)."""
    role: int = pb.ENGINE_ROLE_AGGREGATED
    transfer_backend: str = ""
    """The KV connector (``kv_transfer_config.kv_connector``): a decode's session must name it."""


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """Everything needed to submit one request to ``AsyncLLM.generate``."""

    sampling: dict[str, Any]
    """``SamplingParams`` keyword arguments (``structured_outputs`` excluded)."""
    structured_outputs: dict[str, Any] | None
    """``StructuredOutputsParams`` keyword arguments, when the request is guided."""
    priority: int = 0
    """vLLM's priority: lower runs first, the opposite of OpenEngine's."""


def prompt_input(request: GenerationRequest) -> dict[str, Any]:
    """The prompt dictionary for vLLM's renderer (``TextPrompt`` or ``TokensPrompt`` keys)."""
    prompt: dict[str, Any]
    if request.prompt_token_ids is not None:
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
    else:
        prompt = {"prompt": request.prompt}
    if request.cache_salt is not None:
        prompt["cache_salt"] = request.cache_salt
    return prompt


def plan_generation(request: GenerationRequest, limits: EngineLimits, *, prompt_len: int | None) -> GenerationPlan:
    """Map a validated request for a prompt of ``prompt_len`` tokens; raises ``InvalidArgument``.

    ``prompt_len`` is None for multimodal prompts, whose length vLLM knows only after it
    processed the media: the output budget is then the caller's, or vLLM's own resolution of
    the remaining context (``max_tokens=None``), never vLLM's small default.
    """
    sampling = _sampling(request, limits)
    sampling.update(_stopping(request, limits, prompt_len))
    sampling.update(_output_logprobs(request.output_logprobs))
    sampling.update(_prompt_logprobs(request, limits, prompt_len))
    if request.bypass_prefix_cache:
        sampling["skip_reading_prefix_cache"] = True
    transfer = kv_transfer_params(request, limits)
    if transfer is not None:
        sampling["extra_args"] = {"kv_transfer_params": transfer}
    structured = None
    if request.guidance is not None:
        if request.stopping.ignore_eos:
            raise InvalidArgument(
                "vLLM stops enforcing a guide once its grammar is complete, so with ignore_eos the output "
                "would run on past the guide unconstrained: drop ignore_eos or the guide"
            )
        structured = guided_kwargs(request.guidance, limits.guided_backend)
    priority = 0
    if request.priority is not None:
        if not limits.priority_scheduling:
            raise InvalidArgument("this vLLM engine does not run the priority scheduler")
        priority = -request.priority
    return GenerationPlan(sampling, structured, priority)


_SEED_LIMIT = 2**64
"""vLLM sends seeds to its engine core as msgpack unsigned 64-bit integers."""


def _sampling(request: GenerationRequest, limits: EngineLimits) -> dict[str, Any]:
    given = request.sampling
    values = given.values(limits.sampling_defaults)
    if given.seed is not None:
        values["seed"] = given.seed
    # A prefill computes the prompt's KV once, for one handoff: the decode engine samples the
    # outputs (vLLM would fan a prefill out into children, each with KV of its own to hand off).
    outputs = 1 if limits.role == pb.ENGINE_ROLE_PREFILL else given.num_sequences
    if outputs != 1:
        if values.get("temperature", 1.0) < 1e-5:
            raise InvalidArgument("vLLM samples num_sequences > 1 only with temperature > 0 (greedy gives one output)")
        if given.seed is not None and given.seed + outputs - 1 >= _SEED_LIMIT:
            raise InvalidArgument(
                f"vLLM seeds output i with seed + i: seed {given.seed} leaves no room for {outputs} outputs below 2**64"
            )
        values["n"] = outputs
    return values


def _budget(request: GenerationRequest, limits: EngineLimits, prompt_len: int | None) -> int | None:
    """``max_tokens``: a prefill's one token, the caller's budget, else the model's default
    within the rest of the context."""
    wanted = request.stopping.max_tokens
    if limits.role == pb.ENGINE_ROLE_PREFILL:
        return 1
    if prompt_len is None:  # multimodal: vLLM knows the length, and bounds None by the context
        return wanted if wanted is not None else limits.default_max_tokens
    if prompt_len >= limits.max_model_len:
        raise InvalidArgument(f"prompt has {prompt_len} tokens; the model's context is {limits.max_model_len}")
    room = limits.max_model_len - prompt_len
    if wanted is not None and wanted > room:
        raise InvalidArgument(
            f"prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the context ({limits.max_model_len})"
        )
    if wanted is not None:
        return wanted
    return room if limits.default_max_tokens is None else min(room, limits.default_max_tokens)


def _stopping(request: GenerationRequest, limits: EngineLimits, prompt_len: int | None) -> dict[str, Any]:
    stopping = request.stopping
    max_tokens = _budget(request, limits, prompt_len)
    if max_tokens is not None and stopping.min_tokens > max_tokens:
        raise InvalidArgument(f"stopping.min_tokens ({stopping.min_tokens}) exceeds the output budget ({max_tokens})")
    for token_id in stopping.stop_token_ids:
        _check_vocab(token_id, limits, "stopping stop_token_id")
    values: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": stopping.min_tokens,
        "ignore_eos": stopping.ignore_eos,
        "include_stop_str_in_output": stopping.include_stop_in_output,
    }
    if stopping.stop_texts:
        values["stop"] = list(stopping.stop_texts)
    if stopping.stop_token_ids:
        values["stop_token_ids"] = list(stopping.stop_token_ids)
    return values


def _check_vocab(token_id: int, limits: EngineLimits, what: str) -> None:
    if token_id >= limits.vocab_size:
        raise InvalidArgument(f"{what} {token_id} is outside the vocabulary ({limits.vocab_size} tokens)")


def _output_logprobs(wanted: LogprobRequest | None) -> dict[str, Any]:
    """``logprobs``: the sampled token's logprob and rank always; candidates as selected."""
    if wanted is None:
        return {}
    selection = wanted.candidates
    if selection is None:
        return {"logprobs": 0, "flat_logprobs": True}
    if selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        if len(selection.token_ids) > MAX_LOGPROB_TOKEN_IDS:
            raise InvalidArgument(f"vLLM scores at most {MAX_LOGPROB_TOKEN_IDS} explicit candidate token ids")
        return {"logprob_token_ids": list(selection.token_ids), "flat_logprobs": True}
    return {"logprobs": _count(selection), "flat_logprobs": True}


def _count(selection: CandidateSelection) -> int:
    """vLLM's logprob count for TOP_N (``top_n``) or ALL (-1, the whole vocabulary)."""
    return -1 if selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL else selection.top_n


def _prompt_logprobs(request: GenerationRequest, limits: EngineLimits, prompt_len: int | None) -> dict[str, Any]:
    """Prompt logprobs; explicit candidate ids use vLLM's per-row ``prompt_logprob_token_ids``."""
    wanted = request.prompt_logprobs
    if wanted is None:
        return {}
    start = request.prompt_logprob_start
    if prompt_len is not None and start >= prompt_len:
        raise InvalidArgument(f"response.prompt_logprob_start ({start}) is past the prompt ({prompt_len} tokens)")
    selection = wanted.candidates
    if selection is None:
        return {"prompt_logprobs": 0, "flat_logprobs": True}
    if selection.mode != pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        return {"prompt_logprobs": _count(selection), "flat_logprobs": True}
    if not limits.token_id_logprobs:
        raise InvalidArgument("this vLLM engine cannot score explicit prompt candidate token ids")
    if prompt_len is None:
        raise InvalidArgument("explicit prompt candidate ids need a text or token prompt (vLLM sizes them per row)")
    for token_id in selection.token_ids:
        _check_vocab(token_id, limits, "response.prompt_candidates token id")
    first_row = causal_row(start)
    rows = prompt_len - 1 - first_row
    values: dict[str, Any] = {"prompt_logprobs": 0, "flat_logprobs": True}
    if rows > 0:
        values["prompt_logprob_token_ids"] = [list(selection.token_ids)] * rows
        values["prompt_logprob_start"] = first_row
    return values


def causal_row(start: int) -> int:
    """vLLM's first scored causal row for OpenEngine's first reported prompt position.

    vLLM's row ``r`` predicts prompt token ``r + 1``; OpenEngine reports tokens from position
    ``start`` on, and the token at ``start`` (when ``start > 0``) needs row ``start - 1``.
    """
    return max(start - 1, 0)


def guided_kwargs(guidance: Guidance, engine_backend: str | None) -> dict[str, Any]:
    """``StructuredOutputsParams`` keyword arguments for ``guidance``.

    vLLM picks its grammar backend per engine, not per request, so a request naming a backend
    other than the one the engine was started with is rejected.
    """
    guidance.require_backend(engine_backend, engine="vLLM", setting="structured-outputs backend")
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        return {"choice": list(guidance.choices)}
    if guidance.mode == pb.GUIDED_DECODING_MODE_JSON_OBJECT:
        return {"json_object": True}
    return {_GUIDE_FIELDS[guidance.mode]: guidance.spec}


def kv_transfer_params(request: GenerationRequest, limits: EngineLimits) -> dict[str, Any] | None:
    """vLLM's ``kv_transfer_params`` for a disaggregated request (None when aggregated).

    A prefill asks the connector to keep the KV for a remote decode; a decode passes the
    prefill's final parameters (its ``KvSessionRef`` attributes) back to the connector, once
    the session is checked to come from this connector: given none, vLLM would quietly
    prefill the prompt itself.
    """
    if limits.role == pb.ENGINE_ROLE_PREFILL:
        return {"do_remote_decode": True, "do_remote_prefill": False}
    session = request.kv_session
    if session is None:
        return None
    if session.transfer_backend != limits.transfer_backend:
        raise InvalidArgument(
            f"kv.session.transfer_backend {session.transfer_backend!r} is not this engine's KV connector "
            f"({limits.transfer_backend!r})"
        )
    if not session.attributes:
        raise InvalidArgument("kv.session carries no transfer parameters from its prefill (attributes)")
    params: dict[str, Any] = restore_numbers(dict(session.attributes))
    return params


def restore_numbers(value: Any) -> Any:
    """Undo ``google.protobuf.Struct``'s float-only numbers: integral floats become ints again.

    vLLM's transfer parameters hold ints (ports, block ids, sizes) that a connector needs as
    ints; no connector parameter is a float with an integral value.
    """
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    if isinstance(value, Mapping):
        return {key: restore_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [restore_numbers(item) for item in value]
    return value


def prefill_session(
    request_id: str, params: Mapping[str, Any] | None, *, transfer_backend: str, dp_rank: int
) -> KvSession:
    """The ``KvSession`` a prefill hands to decode: vLLM's final ``kv_transfer_params`` as attributes."""
    return KvSession(
        session_id=request_id,
        transfer_backend=transfer_backend,
        dp_rank=dp_rank,
        attributes=dict(params or {}),
    )


def eos_token_ids(eos: int | None, generation_config: Mapping[str, Any]) -> tuple[int, ...]:
    """The model's EOS ids: the tokenizer's and the generation config's (``int`` or list)."""
    ids: list[int] = [] if eos is None else [eos]
    extra = generation_config.get("eos_token_id")
    for token_id in [extra] if isinstance(extra, int) else list(extra or ()):
        if token_id not in ids:
            ids.append(token_id)
    return tuple(ids)


def sampling_defaults(diff_sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The generation-config defaults that apply when a request leaves a sampling knob unset."""
    return {name: diff_sampling_params[name] for name in Sampling.KNOBS if name in diff_sampling_params}


__all__ = [
    "MAX_LOGPROB_TOKEN_IDS",
    "EngineLimits",
    "GenerationPlan",
    "causal_row",
    "eos_token_ids",
    "guided_kwargs",
    "kv_transfer_params",
    "plan_generation",
    "prefill_session",
    "prompt_input",
    "restore_numbers",
    "sampling_defaults",
]
