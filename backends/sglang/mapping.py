"""``GenerationRequest`` → SGLang ``GenerateReqInput`` fields: pure functions, no SGLang import.

The results are plain values: the sampling dictionary SGLang's ``SamplingParams`` is built from,
and the other fields of the ``GenerateReqInput`` that ``Engine.async_generate`` would build (the
driver builds it itself, for ``return_text_in_logprobs``, which ``async_generate`` does not take).
Everything SGLang would refuse, or would silently do differently from the contract, is rejected
here with ``InvalidArgument`` before the request is accepted.

Three SGLang facts shape the mapping:

* ``max_new_tokens`` defaults to 128, so it is always set: the caller's budget or, without one,
  the rest of the context as SGLang's scheduler bounds it.
* ``num_sequences`` runs as that many single SGLang requests (what SGLang's own ``n`` expands to
  inside its tokenizer manager, but under request ids this driver chose, so each can be aborted).
* SGLang aborts by request-id *prefix*: every id given to SGLang starts with its own fixed-width
  serial number, so no id is a prefix of another (``request_rid``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    Endpoint,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Media,
    resolve_max_tokens,
)

MAX_STOP_STRINGS = 32
"""SGLang's ``MAX_STOP_COUNT`` (``sampling/sampling_params.py``)."""
MAX_REPETITION_PENALTY = 2.0
"""SGLang's ``SamplingParams.verify`` accepts a repetition penalty in (0, 2]."""
_SEED_RANGE = 1 << 64
_TOP_K_OFF = -1
_GUIDE_FIELDS = {
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA: "json_schema",
    pb.GUIDED_DECODING_MODE_REGEX: "regex",
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR: "ebnf",
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG: "structural_tag",
}
JSON_OBJECT_SCHEMA = '{"type": "object"}'
"""What SGLang's OpenAI server compiles for ``response_format: json_object``."""
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""SGLang's ``disaggregation.utils.FAKE_BOOTSTRAP_HOST``: a decode that needs no prefill (its health check)."""
_REGEX_SPECIAL = frozenset("\\.^$*+?()[]{}|/-")
_MEDIA_FIELDS = {pb.MODALITY_IMAGE: "image_data", pb.MODALITY_VIDEO: "video_data", pb.MODALITY_AUDIO: "audio_data"}
_ALL = pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL
MAX_CANDIDATES = 256
"""Logprob candidates per position a request may ask for (top N, explicit ids, or "all" of a vocabulary
no larger). SGLang turns each one into text on the gateway's event loop
(``TokenizerManager.detokenize_top_logprobs_tokens``, one ``batch_decode`` per position): about 1.2 µs a
candidate on the CI machine's CPU, so 256 cost about 0.3 ms a position, where "all" of a 128k vocabulary
would cost about 150 ms a position and stall every stream the gateway serves."""
_IDS = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What per-request mapping needs to know about the started engine."""

    max_context: int
    """Prompt plus output tokens SGLang admits: its ``max_req_len`` less the one token it reserves."""
    max_prompt: int
    """The longest prompt SGLang admits (one less than its ``max_req_input_len``)."""
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    """The model's generation-config defaults (``--sampling-defaults model``, SGLang's default) for knobs a
    request leaves unset. SGLang 0.5.23 applies them itself only in chat (``serving_chat.py``), not to
    ``/generate``, completions or ``Engine``; the driver applies them to every request, as vLLM's server
    does to completions, so that one request means the same on vLLM, SGLang and TensorRT-LLM."""
    grammar_backend: str | None = None
    """The engine's grammar backend; None when guided decoding is off (``--grammar-backend none``)."""
    priority_scheduling: bool = False
    low_priority_values_first: bool = False
    deterministic: bool = False
    """``--enable-deterministic-inference``: only then does SGLang honour a per-request seed."""
    dp_size: int = 1
    """Data-parallel replicas (``dp_size`` as SGLang resolves it: 1 under attention DP)."""
    dp_ranks: int = 1
    """Data-parallel ranks a request may be routed to: replicas times attention-DP groups."""
    role: pb.EngineRole.ValueType = pb.ENGINE_ROLE_AGGREGATED
    transfer_backend: str = ""
    has_tokenizer: bool = True
    """False under ``--skip-tokenizer-init``: SGLang then refuses stop strings and min_tokens."""


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """Everything needed to submit one request's outputs as ``GenerateReqInput`` objects."""

    shared: dict[str, Any]
    """Fields every output's SGLang request takes (input, logprobs, routing, LoRA...)."""
    outputs: tuple[dict[str, Any], ...]
    """Per output: its ``sampling_params`` and, for output 0 only, the prompt-logprob start."""


def request_rid(serial: int, request_id: str, index: int) -> str:
    """The SGLang request id of output (or task item) ``index``, under its own ``serial``.

    Every id starts with a distinct 16-digit serial, so any two differ within their first 16
    characters and none is a prefix of another (the request id and index only make it readable).
    """
    return f"{serial:016x}-{request_id}-{index}"


def plan_generation(
    request: GenerationRequest, limits: EngineLimits, *, input_ids: Sequence[int] | None
) -> GenerationPlan:
    """Map a validated request whose prompt is ``input_ids``; raises ``InvalidArgument``.

    The engine tokenizes text prompts itself (as SGLang's tokenizer manager would) and hands
    the ids here, so the prompt's length is known before acceptance. ``input_ids`` is None for
    a multimodal prompt, whose length SGLang knows only after it processed the media: the text
    goes to SGLang, and the output budget is then the caller's, or ``None``, which SGLang's
    scheduler bounds by the remaining context (never its default of 128).
    """
    if request.media and limits.role == pb.ENGINE_ROLE_PREFILL:
        raise InvalidArgument("a prefill engine reports the prompt's tokens at admission: it takes no media")
    shared: dict[str, Any] = {"stream": True}
    if input_ids is not None:
        _check_vocab(input_ids, limits, "token_ids")
        shared["input_ids"] = list(input_ids)
    else:
        shared["text"] = request.prompt
    sampling = _sampling(request, limits)
    sampling.update(_stopping(request, limits, None if input_ids is None else len(input_ids)))
    if request.guidance is not None:
        sampling.update(guided_fields(request.guidance, limits.grammar_backend))
    shared.update(media_kwargs(request.media))
    shared.update(_logprob_kwargs(request, limits))
    if request.cache_salt is not None:
        shared["cache_salt"] = request.cache_salt
    if request.lora_name is not None:
        shared["lora_path"] = request.lora_name
    if request.data_parallel_rank is not None:
        shared["routed_dp_rank"] = request.data_parallel_rank
    if request.priority is not None:
        shared["priority"] = sglang_priority(request.priority, limits)
    if request.kv_session is not None:
        shared.update(decode_bootstrap(request.kv_session, limits))
    elif limits.role == pb.ENGINE_ROLE_DECODE:  # the gateway's health probe: decode as SGLang's own health check does
        shared.update(bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_room=0)
    return GenerationPlan(shared, _per_output(request, sampling, deterministic=limits.deterministic))


DETERMINISTIC_DEFAULT_SEED = 42
"""The seed SGLang's deterministic mode gives a request without one (``sampling_batch_info.py``)."""


def _per_output(
    request: GenerationRequest, sampling: dict[str, Any], *, deterministic: bool
) -> tuple[dict[str, Any], ...]:
    """One SGLang request per output: seeds ``seed + index`` (else the samples would be equal).

    In deterministic mode SGLang seeds every unseeded request alike, so several unseeded outputs
    start from its default seed: the first is what one unseeded output would be, the others differ.
    """
    seed = request.sampling.seed
    if seed is None and deterministic and request.sampling.num_sequences > 1:
        seed = DETERMINISTIC_DEFAULT_SEED
    prompt_start = prompt_logprob_row(request.prompt_logprob_start) if request.prompt_logprobs else -1
    outputs = []
    for index in range(request.sampling.num_sequences):
        params = dict(sampling)
        if seed is not None:
            params["sampling_seed"] = signed_seed(seed + index)
        output: dict[str, Any] = {"sampling_params": params}
        if request.output_logprobs or request.prompt_logprobs:
            output["logprob_start_len"] = prompt_start if index == 0 else -1
        outputs.append(output)
    return tuple(outputs)


def signed_seed(seed: int) -> int:
    """An unsigned 64-bit seed as SGLang's signed ``sampling_seed`` (two's complement, one to one)."""
    seed %= _SEED_RANGE
    return seed - _SEED_RANGE if seed >= _SEED_RANGE >> 1 else seed


def _sampling(request: GenerationRequest, limits: EngineLimits) -> dict[str, Any]:
    given = request.sampling
    values = given.values(limits.sampling_defaults)
    if values.get("top_k") == 0:
        values["top_k"] = _TOP_K_OFF
    penalty = values.get("repetition_penalty")
    if penalty is not None and penalty > MAX_REPETITION_PENALTY:
        raise InvalidArgument(f"SGLang takes a repetition_penalty up to {MAX_REPETITION_PENALTY}, not {penalty}")
    if given.seed is not None and not limits.deterministic:
        raise InvalidArgument("SGLang honours a per-request seed only with --enable-deterministic-inference")
    return values


def _stopping(request: GenerationRequest, limits: EngineLimits, prompt_len: int | None) -> dict[str, Any]:
    stopping = request.stopping
    budget = stopping.max_tokens
    if prompt_len is not None:
        if prompt_len > limits.max_prompt:
            raise InvalidArgument(f"prompt has {prompt_len} tokens; this engine takes at most {limits.max_prompt}")
        budget = resolve_max_tokens(request, prompt_len, limits.max_context)
    if budget is not None and stopping.min_tokens > budget:
        raise InvalidArgument(f"stopping.min_tokens ({stopping.min_tokens}) exceeds the output budget ({budget})")
    if len(stopping.stop_texts) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"SGLang takes at most {MAX_STOP_STRINGS} stop strings")
    if not limits.has_tokenizer and (stopping.stop_texts or stopping.min_tokens):
        # SGLang would fail these after acceptance (sampling_params.raise_if_tokenizer_required).
        raise InvalidArgument("this SGLang engine runs without a tokenizer: stop strings and min_tokens need one")
    if stopping.min_tokens and stopping.stop_texts:
        # SGLang's scheduler checks stop strings from the first token (Req.update_finish_state); its
        # min_new_tokens holds back only stop tokens and EOS (sampling/penaltylib/min_new_tokens.py).
        raise InvalidArgument(
            "SGLang matches stop strings from the first token: with min_tokens one could end the output "
            "before min_tokens; use stop token ids, or no min_tokens"
        )
    _check_vocab(stopping.stop_token_ids, limits, "stop_token_id")
    values: dict[str, Any] = {
        "max_new_tokens": budget,
        "min_new_tokens": stopping.min_tokens,
        "ignore_eos": stopping.ignore_eos,
        "no_stop_trim": stopping.include_stop_in_output,
    }
    if stopping.stop_texts:
        values["stop"] = list(stopping.stop_texts)
    if stopping.stop_token_ids and not stopping.ignore_eos:  # with ignore_eos SGLang would not stop on them:
        values["stop_token_ids"] = list(stopping.stop_token_ids)  # ``outputs.RequestStream`` watches for them
    return values


def _check_vocab(token_ids: Any, limits: EngineLimits, what: str) -> None:
    for token_id in token_ids:
        if token_id >= limits.vocab_size:
            raise InvalidArgument(f"{what} {token_id} is outside the vocabulary ({limits.vocab_size} tokens)")


def _logprob_kwargs(request: GenerationRequest, limits: EngineLimits) -> dict[str, Any]:
    """SGLang's one logprob configuration for both sides: the union of what each side selects.

    SGLang applies ``top_logprobs_num`` and ``token_ids_logprob`` to prompt and output alike, so
    the driver asks for the larger top-N and every explicit id, and each side keeps its own
    selection (``outputs``). Token texts come back with the logprobs.
    """
    sides = [side for side in (request.output_logprobs, request.prompt_logprobs) if side is not None]
    if not sides:
        return {}
    top_n = max((_top_n(side, limits) for side in sides), default=0)
    token_ids: list[int] = []
    for side in sides:
        if side.candidates is not None and side.candidates.mode == _IDS:
            token_ids.extend(i for i in side.candidates.token_ids if i not in token_ids)
    _check_vocab(token_ids, limits, "candidate token id")
    if len(token_ids) > MAX_CANDIDATES:
        raise InvalidArgument(
            f"at most {MAX_CANDIDATES} candidate token ids (SGLang detokenizes each at every position)"
        )
    kwargs: dict[str, Any] = {"return_logprob": True, "return_text_in_logprobs": True}
    if top_n:
        kwargs["top_logprobs_num"] = top_n
    if token_ids:
        kwargs["token_ids_logprob"] = token_ids
    return kwargs


def _top_n(side: LogprobRequest, limits: EngineLimits) -> int:
    selection = side.candidates
    if selection is None or selection.mode == _IDS:
        return 0
    if selection.mode == _ALL and limits.vocab_size > MAX_CANDIDATES:
        raise InvalidArgument(
            f"all {limits.vocab_size} vocabulary entries as candidates: SGLang would detokenize each at every "
            f"position; ask for top_n up to {MAX_CANDIDATES}"
        )
    top_n = limits.vocab_size if selection.mode == _ALL else min(selection.top_n, limits.vocab_size)
    if top_n > MAX_CANDIDATES:
        raise InvalidArgument(f"top_n {top_n} is above this engine's maximum ({MAX_CANDIDATES})")
    return top_n


def prompt_logprob_row(start: int) -> int:
    """SGLang's ``logprob_start_len`` for OpenEngine's first reported prompt position.

    SGLang's first returned prompt entry never has a logprob (it is the first token of what it
    computed), so a position ``start > 0`` needs SGLang to start one token earlier.
    """
    return max(start - 1, 0)


def guided_fields(guidance: Guidance, engine_backend: str | None) -> dict[str, Any]:
    """The sampling keys of a guide; choice and JSON object become a regex and a JSON schema.

    SGLang picks its grammar backend per engine, so a request naming another is rejected.
    """
    guidance.require_backend(engine_backend, engine="SGLang", setting="grammar backend")
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        return {"regex": choice_regex(guidance.choices)}
    if guidance.mode == pb.GUIDED_DECODING_MODE_JSON_OBJECT:
        return {"json_schema": JSON_OBJECT_SCHEMA}
    if guidance.mode == pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG and engine_backend == "llguidance":
        _require_legacy_structural_tag(guidance.spec)
    return {_GUIDE_FIELDS[guidance.mode]: guidance.spec}


def _require_legacy_structural_tag(spec: str) -> None:
    """SGLang's llguidance backend compiles only the legacy form (``structures`` and ``triggers``);
    xgrammar also takes the ``format`` form."""
    try:
        tag = json.loads(spec)
    except ValueError as exc:
        raise InvalidArgument(f"guided.structural_tag is not JSON: {exc}") from None
    if not (isinstance(tag, dict) and tag.get("structures") is not None and tag.get("triggers") is not None):
        raise InvalidArgument(
            "this SGLang engine's llguidance backend takes a structural tag with 'structures' and 'triggers' only"
        )


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex matching exactly one of ``choices`` (literal text, metacharacters escaped)."""
    return "(" + "|".join("".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in choice) for choice in choices) + ")"


def sglang_priority(priority: int, limits: EngineLimits) -> int:
    """SGLang's priority: it runs larger values first, like OpenEngine, unless told otherwise."""
    if not limits.priority_scheduling:
        raise InvalidArgument("this SGLang engine does not run priority scheduling")
    return -priority if limits.low_priority_values_first else priority


def media_kwargs(media: tuple[Media, ...]) -> dict[str, list[str]]:
    """``image_data``/``video_data``/``audio_data`` lists SGLang fetches and decodes itself.

    URLs and data URIs pass as they are; raw bytes become a base64 data URI.
    """
    lists: dict[str, list[str]] = {}
    for item in media:
        source = item.url or item.data_uri
        if source is None:
            mime = item.mime_type or "application/octet-stream"
            source = f"data:{mime};base64,{base64.b64encode(item.raw_bytes or b'').decode()}"
        lists.setdefault(_MEDIA_FIELDS[item.modality], []).append(source)
    return lists


def prefill_session(
    request_id: str, *, host: str, port: int, room: int, limits: EngineLimits, routed_rank: int | None
) -> KvSession:
    """The session a prefill hands to decode: SGLang's bootstrap host, port and room.

    ``room`` is below 2**53 so it survives ``google.protobuf.Struct`` numbers. With several DP
    ranks SGLang's prefill serves a room on rank ``room % dp_ranks`` (its DP controller's
    ``follow_bootstrap_room_scheduler``, attention-DP ranks included) unless the request was
    routed; a routed rank travels as ``prefill_dp_rank`` for the decode side's hint.
    """
    attributes: dict[str, Any] = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    if routed_rank is not None:
        attributes["prefill_dp_rank"] = routed_rank
    return KvSession(
        session_id=f"{request_id}@{room}",
        transfer_backend=limits.transfer_backend,
        endpoints=(Endpoint(host, port, "http"),),
        dp_rank=routed_rank if routed_rank is not None else room % max(limits.dp_ranks, 1),
        attributes=attributes,
    )


def prefill_kwargs(session: KvSession) -> dict[str, Any]:
    """The bootstrap arguments of the prefill's own SGLang request."""
    attributes = session.attributes
    kwargs = {key: attributes[key] for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
    if "prefill_dp_rank" in attributes:
        kwargs["disagg_prefill_dp_rank"] = attributes["prefill_dp_rank"]
    return kwargs


def decode_bootstrap(session: KvSession, limits: EngineLimits) -> dict[str, Any]:
    """A decode request's bootstrap arguments, from the prefill's ``KvSessionRef`` attributes.

    Struct numbers arrive as floats; integral strings are accepted too (for rooms above 2**53).
    """
    if session.transfer_backend and limits.transfer_backend and session.transfer_backend != limits.transfer_backend:
        raise InvalidArgument(
            f"kv.session uses transfer backend {session.transfer_backend!r}; this engine uses "
            f"{limits.transfer_backend!r}"
        )
    attributes = session.attributes
    host = attributes.get("bootstrap_host")
    if not isinstance(host, str) or not host:
        raise InvalidArgument("kv.session lacks bootstrap_host (an SGLang prefill's PrefillReady carries it)")
    kwargs: dict[str, Any] = {
        "bootstrap_host": host,
        "bootstrap_port": _integer(attributes, "bootstrap_port"),
        "bootstrap_room": _integer(attributes, "bootstrap_room"),
    }
    if "prefill_dp_rank" in attributes:
        kwargs["disagg_prefill_dp_rank"] = _integer(attributes, "prefill_dp_rank")
    return kwargs


def _integer(attributes: Mapping[str, Any], key: str) -> int:
    value = attributes.get(key)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise InvalidArgument(f"kv.session attribute {key} must be an integer, not {value!r}")


def tokenize(tokenizer: Any, text: str, *, special_tokens: bool = True) -> list[int]:
    """Token ids as SGLang's tokenizer manager makes them (a fast tokenizer's call, else ``encode``).

    ``special_tokens=False`` leaves out what the tokenizer adds (a BOS): for text that continues
    other tokens rather than starting a sequence.
    """
    if getattr(tokenizer, "is_fast", False):
        return list(tokenizer(text, add_special_tokens=special_tokens)["input_ids"])
    return list(tokenizer.encode(text, add_special_tokens=special_tokens))


def text_decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    """Token ids → text as SGLang's detokenizer shows it (special tokens skipped); none without a tokenizer."""
    if tokenizer is None:
        return lambda _ids: ""
    return lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True))


def eos_token_ids(tokenizer_eos: int | None, extra_stop_ids: Any, model_eos: Any) -> tuple[int, ...]:
    """Every id SGLang ends an output on by itself: the tokenizer's EOS and additional stop ids,
    and the model config's ``hf_eos_token_id`` set."""
    ids: list[int] = [] if tokenizer_eos is None else [tokenizer_eos]
    for token_id in sorted(extra_stop_ids or ()) + sorted(model_eos or ()):
        if token_id not in ids:
            ids.append(token_id)
    return tuple(ids)


__all__ = [
    "FAKE_BOOTSTRAP_HOST",
    "JSON_OBJECT_SCHEMA",
    "MAX_CANDIDATES",
    "MAX_REPETITION_PENALTY",
    "MAX_STOP_STRINGS",
    "EngineLimits",
    "GenerationPlan",
    "choice_regex",
    "decode_bootstrap",
    "eos_token_ids",
    "guided_fields",
    "media_kwargs",
    "plan_generation",
    "prefill_kwargs",
    "prefill_session",
    "prompt_logprob_row",
    "request_rid",
    "sglang_priority",
    "signed_seed",
    "text_decoder",
    "tokenize",
]
