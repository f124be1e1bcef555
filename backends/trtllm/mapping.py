"""``GenerationRequest`` → TensorRT-LLM request parameters: pure functions, no TensorRT-LLM import.

The results are plain values: keyword arguments for ``SamplingParams``,
``GuidedDecodingParams`` and ``DisaggregatedParams``, the scheduling priority and the
attention-DP rank. ``engine.py`` builds the TensorRT-LLM objects from them. Whatever the
engine cannot honour is rejected here with ``InvalidArgument``, before acceptance.

Choices that shape the mapping. Stop strings are not handed to TensorRT-LLM: it matches them
on the cumulative text, trims tokens it already streamed, and aborts the whole request when
one output of several matches; the driver matches them per output instead (``outputs``).
``include_stop_str_in_output`` is passed so TensorRT-LLM drops a matched caller stop token.
Knobs the sampler would ignore are refused and unset ones take the engine's defaults
(``sampling``). ``min_tokens`` holds back the end id alone in TensorRT-LLM
(``_apply_min_length_penalty``), so a caller's stop token could still end an output early:
``min_tokens`` with stop tokens is refused.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    Endpoint,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Stopping,
    resolve_max_tokens,
)

from .capabilities import EngineFeatures
from .sampling import refuse_unapplied

_GUIDE_FIELDS = {
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA: "json",
    pb.GUIDED_DECODING_MODE_REGEX: "regex",
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR: "grammar",
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG: "structural_tag",
}
_REGEX_SPECIALS = frozenset("\\^$.|?*+()[]{}/")
_INT_HANDOFF = ("ctx_dp_rank", "schedule_style")
_INT_LIST_HANDOFF = ("first_gen_tokens", "draft_tokens")
_HANDOFF_KEYS = frozenset(
    {
        *_INT_HANDOFF,
        *_INT_LIST_HANDOFF,
        "opaque_state",
        "ctx_info_endpoint",
        "disagg_request_id",
        "ctx_usage",
        "first_gen_log_probs",
    }
)
"""What a prefill's session may carry: this driver's attributes and those of TensorRT-LLM's own servicer
(``grpc/openengine/disagg.py``, which adds ``ctx_usage`` and ``first_gen_log_probs``)."""
_LOCATORS = ("opaque_state", "ctx_info_endpoint")


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """Everything needed to submit one request to ``LLM.generate_async``."""

    sampling: dict[str, Any]
    """``SamplingParams`` keyword arguments (``guided_decoding`` excluded)."""
    guided: dict[str, Any] | None = None
    """``GuidedDecodingParams`` keyword arguments, when the request is guided."""
    disaggregated: dict[str, Any] | None = None
    """``DisaggregatedParams`` keyword arguments for a prefill or decode engine."""
    priority: float | None = None
    """TensorRT-LLM's priority in [0, 1] (larger first, 0.5 by default)."""
    attention_dp_rank: int | None = None


def plan_generation(request: GenerationRequest, features: EngineFeatures, *, prompt_len: int) -> GenerationPlan:
    """Map a validated request for a prompt of ``prompt_len`` tokens; raises ``InvalidArgument``."""
    sampling = _sampling(request, features)
    sampling.update(_stopping(request, features, prompt_len))
    sampling.update(_logprobs(request.output_logprobs, sampling, features))
    guided = guided_kwargs(request.guidance, features.guided_backend) if request.guidance else None
    priority = None
    if request.priority is not None:
        if not features.priority:
            raise InvalidArgument("this TensorRT-LLM engine does not schedule by priority")
        priority = trt_priority(request.priority)
    return GenerationPlan(
        sampling=sampling,
        guided=guided,
        disaggregated=disaggregated_kwargs(request, features),
        priority=priority,
        attention_dp_rank=_attention_dp_rank(request, features),
    )


def _sampling(request: GenerationRequest, features: EngineFeatures) -> dict[str, Any]:
    given = request.sampling
    refuse_unapplied(given, features.sampler_knobs)
    values = given.values(features.sampling.values)
    if given.seed is not None:
        values["seed"] = given.seed
    if not features.has_tokenizer and features.eos_token_ids:
        values["end_id"] = features.eos_token_ids[0]
    return values


def _stopping(request: GenerationRequest, features: EngineFeatures, prompt_len: int) -> dict[str, Any]:
    stopping = request.stopping
    if features.role == pb.ENGINE_ROLE_PREFILL:  # the context phase; the decode engine applies the stopping
        stopping = Stopping(max_tokens=1)
        request = dataclasses.replace(request, stopping=stopping)
    generation_only = request.kv_session is not None and features.role != pb.ENGINE_ROLE_PREFILL
    max_tokens = resolve_max_tokens(request, prompt_len, features.max_context(generation_only=generation_only))
    if stopping.min_tokens and stopping.stop_token_ids:
        raise InvalidArgument(
            "stopping.min_tokens with stop token ids: TensorRT-LLM holds back only the end-of-sequence token "
            "until min_tokens, so a stop token could end the output early"
        )
    if stopping.min_tokens > max_tokens:
        raise InvalidArgument(f"stopping.min_tokens ({stopping.min_tokens}) exceeds the output budget ({max_tokens})")
    values: dict[str, Any] = {
        "max_tokens": max_tokens,
        "ignore_eos": stopping.ignore_eos,
        "include_stop_str_in_output": stopping.include_stop_in_output,
    }
    if stopping.min_tokens:
        values["min_tokens"] = stopping.min_tokens
    if stopping.stop_token_ids:
        values["stop_token_ids"] = list(stopping.stop_token_ids)
    return values


def _logprobs(wanted: LogprobRequest | None, sampling: dict[str, Any], features: EngineFeatures) -> dict[str, Any]:
    """TensorRT-LLM's top-k count, wide enough that every row holds the sampled token.

    ``TorchSampler`` returns the top-k rows of the unscaled distribution and nothing for the
    sampled token itself (``_torch/pyexecutor/sampler.py``, the 1.2-period text: ``torch.topk``
    over ``log_softmax``). Greedy decoding samples the top token, and top-k sampling one of the
    top k, so asking ``max(top_n, top_k)`` rows holds every sampled token (the candidates are cut
    to the top N asked for, ``outputs``); any other sampling could sample a token no row holds,
    and every record must carry its own logprob, so it is refused. The speculative samplers return
    the sampled token's logprob alone (``features.sampled_logprob_only``).
    """
    if wanted is None:
        return {}
    top_n = wanted.candidates.top_n if wanted.candidates is not None else 0
    if _greedy(sampling) or features.sampled_logprob_only:
        return {"logprobs": max(top_n, 1)}
    cap = features.max_top_logprobs
    top_k = int(sampling.get("top_k") or 0)
    if 0 < top_k <= cap:
        return {"logprobs": max(top_n, top_k)}
    raise InvalidArgument(
        f"output logprobs while sampling need sampling.top_k between 1 and {cap} on TensorRT-LLM (or temperature "
        "0): its sampler returns the top-k logprobs only, so a sampled token outside them would have none"
    )


def _greedy(sampling: dict[str, Any]) -> bool:
    """``SamplingParams._greedy_decoding`` for the knobs the driver sets (``sampling_params.py``)."""
    return sampling.get("temperature") == 0 or sampling.get("top_k") == 1 or sampling.get("top_p") == 0


def _attention_dp_rank(request: GenerationRequest, features: EngineFeatures) -> int | None:
    """The attention-DP rank to pin; a single-rank engine honours rank 0 as it is."""
    rank = request.data_parallel_rank
    if rank is None or not features.attention_dp:
        return None
    return rank


def guided_kwargs(guidance: Guidance, engine_backend: str | None) -> dict[str, Any]:
    """``GuidedDecodingParams`` keyword arguments; a choice is a regex alternation.

    TensorRT-LLM picks its grammar backend per engine (``guided_decoding_backend``) and,
    without one, ignores guidance silently, so both cases are rejected here.
    """
    guidance.require_backend(engine_backend, engine="TensorRT-LLM", setting="guided_decoding_backend")
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        return {"regex": choice_regex(guidance.choices)}
    if guidance.mode == pb.GUIDED_DECODING_MODE_JSON_OBJECT:
        return {"json_object": True}
    return {_GUIDE_FIELDS[guidance.mode]: guidance.spec}


def choice_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of ``choices`` (metacharacters escaped, nothing else)."""
    escaped = ("".join(f"\\{c}" if c in _REGEX_SPECIALS else c for c in choice) for choice in choices)
    return f"({'|'.join(escaped)})"


def trt_priority(priority: int) -> float:
    """OpenEngine's int32 priority (larger first) as TensorRT-LLM's [0, 1] (larger first).

    ``0.5 + 0.5 * p / (1 + |p|)``: order-preserving, 0 maps to TensorRT-LLM's default 0.5,
    and small priorities stay far apart (TensorRT-LLM keeps a 32-bit float, so priorities
    beyond about ±2900 can tie).
    """
    return 0.5 + 0.5 * priority / (1 + abs(priority))


def disaggregated_kwargs(request: GenerationRequest, features: EngineFeatures) -> dict[str, Any] | None:
    """``DisaggregatedParams`` keyword arguments: context-only on a prefill engine,
    generation-only (the prefill's handoff) on a decode engine, None when aggregated."""
    if features.role == pb.ENGINE_ROLE_PREFILL:
        return {"request_type": "context_only"}
    if request.kv_session is None:
        return None
    return handoff_params(request.kv_session, features.handoff_fields)


def handoff_params(session: KvSession, fields: frozenset[str]) -> dict[str, Any]:
    """A prefill's ``KvSession`` back as generation-only ``DisaggregatedParams`` arguments.

    Takes this driver's sessions and those of TensorRT-LLM's own servicer, as its
    ``grpc/openengine/disagg.py`` reads them: ``ctx_usage``
    (token counts) and ``first_gen_log_probs`` (per position a float, or ``[token_id, logprob,
    rank]`` triples) may be present; the latter come back as floats or ``{token_id: (logprob,
    rank)}`` for ``engine`` to make ``Logprob``s of. Only the ``fields`` the installed
    ``DisaggregatedParams`` has are passed (1.2's lacks ``ctx_dp_rank``, ``ctx_info_endpoint``,
    ``schedule_style``, ``disagg_request_id``, ``first_gen_log_probs`` and ``ctx_usage``).
    TensorRT-LLM waits for the context worker on its executor loop without a timeout, so a
    session it could not resolve is rejected here rather than stalling every request.
    """
    attributes = dict(session.attributes)
    unknown = sorted(set(attributes) - _HANDOFF_KEYS)
    if unknown:
        raise InvalidArgument(f"kv.session carries attributes TensorRT-LLM does not take: {', '.join(unknown)}")
    try:
        params: dict[str, Any] = {"request_type": "generation_only", "ctx_request_id": int(session.session_id)}
        for name in _INT_HANDOFF:
            if name in attributes:
                params[name] = int(attributes[name])
        for name in _INT_LIST_HANDOFF:
            if attributes.get(name):
                params[name] = [int(token) for token in attributes[name]]
        if "disagg_request_id" in attributes:
            params["disagg_request_id"] = int(str(attributes["disagg_request_id"]))
        if attributes.get("opaque_state"):
            params["opaque_state"] = base64.b64decode(str(attributes["opaque_state"]), validate=True)
        if attributes.get("ctx_usage") is not None:
            params["ctx_usage"] = {str(key): _count(value) for key, value in dict(attributes["ctx_usage"]).items()}
        if attributes.get("first_gen_log_probs") is not None:
            params["first_gen_log_probs"] = [_position(entry) for entry in attributes["first_gen_log_probs"]]
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InvalidArgument(f"kv.session is not a TensorRT-LLM handoff: {exc}") from None
    if "ctx_dp_rank" not in params and session.dp_rank:
        # A prefill that reported no rank leaves it unset, as TensorRT-LLM's own handoff does: pinning
        # rank 0 would be wrong for an attention-DP context engine, and older builds take no such field.
        params["ctx_dp_rank"] = session.dp_rank
    endpoint = attributes.get("ctx_info_endpoint")
    if endpoint:
        params["ctx_info_endpoint"] = str(endpoint)
    params = {name: value for name, value in params.items() if name in fields}
    if not any(name in params for name in _LOCATORS):
        wanted = " or ".join(name for name in _LOCATORS if name in fields)
        raise InvalidArgument(f"kv.session carries no {wanted} this TensorRT-LLM takes (it locates the context worker)")
    if not params.get("first_gen_tokens"):
        # TensorRT-LLM's own servicer does not check this, but its prefills always send them; the
        # executor's ContextPhaseParams takes them as a token list, outside 1.2.1's RequestError wrapper.
        raise InvalidArgument("kv.session carries no first_gen_tokens (TensorRT-LLM resumes from the prefill's token)")
    return params


def _count(value: Any) -> Any:
    """A Struct number (a double) back as the token count it was."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _position(entry: Any) -> float | dict[int, tuple[float, int | None]]:
    """One ``first_gen_log_probs`` position as TensorRT-LLM's servicer serialises it."""
    if not isinstance(entry, list):
        return float(entry)
    return {int(token): (float(logprob), None if rank is None else int(rank)) for token, logprob, rank in entry}


def prefill_session(params: Any, *, transfer_backend: str) -> KvSession:
    """The ``KvSession`` a prefill hands to decode, from TensorRT-LLM's ``DisaggregatedParams``.

    The context request id is the session id; ids and opaque bytes travel as strings (a
    Struct number is a double, and ids may pass 2**53), token lists as numbers; ``ctx_usage`` and
    ``first_gen_log_probs`` (a later release's) as TensorRT-LLM's servicer writes them, so either
    side may be TensorRT-LLM's own server.
    """
    attributes: dict[str, Any] = {}
    for name in _INT_HANDOFF:
        value = getattr(params, name, None)
        if value is not None:
            attributes[name] = int(value)
    for name in _INT_LIST_HANDOFF:
        value = getattr(params, name, None)
        if value:
            attributes[name] = [int(token) for token in value]
    disagg_id = getattr(params, "disagg_request_id", None)
    if disagg_id is not None:
        attributes["disagg_request_id"] = str(disagg_id)
    opaque = getattr(params, "opaque_state", None)
    if opaque is not None:
        attributes["opaque_state"] = base64.b64encode(opaque).decode("ascii")
    usage = getattr(params, "ctx_usage", None)
    if usage is not None:
        attributes["ctx_usage"] = dict(usage)
    first_logprobs = getattr(params, "first_gen_log_probs", None)
    if first_logprobs is not None:
        attributes["first_gen_log_probs"] = [_serialised(position) for position in first_logprobs]
    endpoint: str | None = getattr(params, "ctx_info_endpoint", None)
    endpoints: tuple[Endpoint, ...] = ()
    if endpoint:
        attributes["ctx_info_endpoint"] = endpoint
        parts = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        if parts.hostname and parts.port:
            endpoints = (Endpoint(parts.hostname, parts.port, parts.scheme or transfer_backend),)
    return KvSession(
        session_id=str(params.ctx_request_id),
        transfer_backend=transfer_backend,
        endpoints=endpoints,
        dp_rank=int(getattr(params, "ctx_dp_rank", None) or 0),
        attributes=attributes,
    )


def _serialised(position: Any) -> Any:
    """A ``first_gen_log_probs`` position as TensorRT-LLM's servicer writes it (a float, or triples)."""
    if not isinstance(position, dict):
        return float(position)
    return [[int(token), float(entry.logprob), entry.rank] for token, entry in position.items()]


__all__ = [
    "GenerationPlan",
    "choice_regex",
    "disaggregated_kwargs",
    "guided_kwargs",
    "handoff_params",
    "plan_generation",
    "prefill_session",
    "trt_priority",
]
