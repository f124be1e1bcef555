"""``GenerateRequest`` → ``GenerationRequest``: validation before acceptance.

Everything here is engine-neutral and pure. It checks what the contract says about a
request's shape, then checks every explicit option against the target model's advertised
``ModelInfo`` (the same message ``GetModelInfo`` returns), so a client never discovers a
capability that ``Generate`` then rejects, and an option the model does not advertise is
rejected instead of silently ignored.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Container, Iterable
from typing import Literal

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from .. import pb
from ..errors import FailedPrecondition, InvalidArgument
from ..spi.requests import (
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

_GUIDE_MODES = {
    "json_schema": pb.GUIDED_DECODING_MODE_JSON_SCHEMA,
    "regex": pb.GUIDED_DECODING_MODE_REGEX,
    "ebnf_grammar": pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR,
    "structural_tag": pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG,
    "choice": pb.GUIDED_DECODING_MODE_CHOICE,
    "json_object": pb.GUIDED_DECODING_MODE_JSON_OBJECT,
}

_CANDIDATE_MODES = {
    "top_n": pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    "token_ids": pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    "all": pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
}

_FloatSampling = Literal["temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"]
"""The ``SamplingParams`` fields that are optional floats."""

ROLE_NAMES = {
    pb.ENGINE_ROLE_UNSPECIFIED: "unspecified",
    pb.ENGINE_ROLE_AGGREGATED: "aggregated",
    pb.ENGINE_ROLE_PREFILL: "prefill",
    pb.ENGINE_ROLE_DECODE: "decode",
}


def new_request_id() -> str:
    """An id for a request that arrived without one (echoed in every response)."""
    return f"gw-{uuid.uuid4().hex}"


def parse_generate(
    request: pb.GenerateRequest, *, served_name: str, model: pb.ModelInfo, role: pb.EngineRole.ValueType
) -> GenerationRequest:
    """Validate ``request`` for the model ``served_name`` served in ``role``.

    Raises ``InvalidArgument`` for malformed input and unadvertised options, and
    ``FailedPrecondition`` when the request does not fit the engine's role or names a LoRA adapter on a
    LoRA-disabled model.
    """
    caps = model.generation
    prompt, prompt_ids = _parse_input(request, model)
    kv_session = _parse_kv(request, model, role)
    sampling = _parse_sampling(request, caps)
    stopping = _parse_stopping(request, model)
    response = request.response
    output_logprobs = _parse_logprobs(
        "output",
        present=response.HasField("return_output_logprobs"),
        wanted=response.return_output_logprobs,
        selection=response.output_candidates if response.HasField("output_candidates") else None,
        caps=caps.output_logprobs if caps.HasField("output_logprobs") else None,
    )
    prompt_logprobs = _parse_logprobs(
        "prompt",
        present=response.HasField("return_prompt_logprobs"),
        wanted=response.return_prompt_logprobs,
        selection=response.prompt_candidates if response.HasField("prompt_candidates") else None,
        caps=caps.prompt_logprobs if caps.HasField("prompt_logprobs") else None,
    )
    prompt_logprob_start = 0
    if response.HasField("prompt_logprob_start"):
        if prompt_logprobs is None:
            raise InvalidArgument("response.prompt_logprob_start requires return_prompt_logprobs")
        prompt_logprob_start = response.prompt_logprob_start
        if prompt_ids is not None and prompt_logprob_start >= len(prompt_ids):
            raise InvalidArgument(
                f"response.prompt_logprob_start ({prompt_logprob_start}) is past the prompt ({len(prompt_ids)} tokens)"
            )
    if request.HasField("priority") and not _advertised(caps, "supports_priority"):
        raise InvalidArgument(f"model {served_name!r} does not advertise priority scheduling")
    if request.lora_name and not (model.HasField("supports_lora") and model.supports_lora):
        # "A LoRA-disabled engine returns FAILED_PRECONDITION", for lora_name as for the lifecycle RPCs.
        raise FailedPrecondition(f"model {served_name!r} does not advertise LoRA adapters")
    kv = request.kv
    if kv.HasField("cache_salt") and not _advertised(caps, "supports_cache_salt"):
        raise InvalidArgument(f"model {served_name!r} does not advertise cache_salt")
    if kv.HasField("cache_salt") and not kv.cache_salt:
        raise InvalidArgument("kv.cache_salt, when set, must be non-empty")
    if kv.HasField("bypass_prefix_cache") and not _advertised(caps, "supports_prefix_cache_bypass"):
        raise InvalidArgument(f"model {served_name!r} does not advertise bypass_prefix_cache")
    return GenerationRequest(
        request_id=request.request_id or new_request_id(),
        model=served_name,
        prompt=prompt,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        stopping=stopping,
        output_logprobs=output_logprobs,
        prompt_logprobs=prompt_logprobs,
        prompt_logprob_start=prompt_logprob_start,
        guidance=_parse_guidance(request, caps),
        kv_session=kv_session,
        data_parallel_rank=kv.data_parallel_rank if kv.HasField("data_parallel_rank") else None,
        bypass_prefix_cache=kv.bypass_prefix_cache,
        cache_salt=kv.cache_salt if kv.HasField("cache_salt") else None,
        media=parse_media(request.media, model),
        lora_name=request.lora_name or None,
        priority=request.priority if request.HasField("priority") else None,
        metadata=dict(request.metadata),
    )


def _advertised(message: Message, field: str) -> bool:
    """A boolean capability is advertised only when present and true."""
    return bool(message.HasField(field) and getattr(message, field))


def _parse_input(request: pb.GenerateRequest, model: pb.ModelInfo) -> tuple[str | None, list[int] | None]:
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidArgument("exactly one of prompt or token_ids is required")
    if which == "prompt":
        if not request.prompt:
            raise InvalidArgument("prompt must be non-empty")
        if model.HasField("supports_text_input") and not model.supports_text_input:
            raise InvalidArgument("this model takes token_ids only (supports_text_input is false)")
        return request.prompt, None
    if not request.token_ids.ids:
        raise InvalidArgument("token_ids must be non-empty")
    if model.HasField("supports_token_ids_input") and not model.supports_token_ids_input:
        raise InvalidArgument("this model takes text prompts only (supports_token_ids_input is false)")
    ids = list(request.token_ids.ids)
    if model.HasField("max_context_length") and len(ids) >= model.max_context_length:
        raise InvalidArgument(f"prompt has {len(ids)} tokens; the model's context is {model.max_context_length}")
    return None, ids


def _parse_kv(request: pb.GenerateRequest, model: pb.ModelInfo, role: pb.EngineRole.ValueType) -> KvSession | None:
    kv = request.kv
    has_session = kv.HasField("session")
    if role == pb.ENGINE_ROLE_DECODE and not has_session:
        raise FailedPrecondition("this is a decode engine: kv.session (from a prefill's PrefillReady) is required")
    if role != pb.ENGINE_ROLE_DECODE and has_session:
        raise FailedPrecondition(
            f"this is a {ROLE_NAMES.get(role, 'unknown')} engine: only a decode engine accepts kv.session"
        )
    if not has_session:
        return None
    session = kv.session
    if not session.session_id:
        raise InvalidArgument("kv.session.session_id must be non-empty")
    return kv_session_from_proto(session)


def kv_session_from_proto(session: pb.KvSessionRef) -> KvSession:
    """The SPI value of a ``KvSessionRef`` (attributes keep their JSON types)."""
    return KvSession(
        session_id=session.session_id,
        transfer_backend=session.transfer_backend,
        endpoints=tuple(Endpoint(e.host, e.port, e.protocol) for e in session.endpoints),
        dp_rank=session.dp_rank,
        attributes=MessageToDict(session.attributes_struct) if session.HasField("attributes_struct") else {},
    )


def kv_session_to_proto(session: KvSession) -> pb.KvSessionRef:
    """The ``KvSessionRef`` of an SPI session."""
    ref = pb.KvSessionRef(
        session_id=session.session_id,
        transfer_backend=session.transfer_backend,
        endpoints=[pb.KvEndpoint(host=e.host, port=e.port, protocol=e.protocol) for e in session.endpoints],
        dp_rank=session.dp_rank,
    )
    if session.attributes:
        ref.attributes_struct.update(dict(session.attributes))
    return ref


def _parse_sampling(request: pb.GenerateRequest, caps: pb.GenerationCapabilities) -> Sampling:
    s = request.sampling

    def get(name: _FloatSampling) -> float | None:
        if not s.HasField(name):
            return None
        value: float = getattr(s, name)
        if not math.isfinite(value):
            raise InvalidArgument(f"sampling.{name} must be finite")
        return value

    temperature, top_p, min_p = get("temperature"), get("top_p"), get("min_p")
    if temperature is not None and temperature < 0:
        raise InvalidArgument("sampling.temperature must be >= 0")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidArgument("sampling.top_p must be in (0, 1]")
    if min_p is not None and not 0 <= min_p <= 1:
        raise InvalidArgument("sampling.min_p must be in [0, 1]")
    top_k = s.top_k if s.HasField("top_k") else None
    if top_k is not None and top_k < -1:
        raise InvalidArgument("sampling.top_k must be >= 1, or 0 (or -1) for no limit")
    penalties: tuple[_FloatSampling, ...] = ("frequency_penalty", "presence_penalty")
    for name in penalties:
        value = get(name)
        if value is not None and not -2 <= value <= 2:
            raise InvalidArgument(f"sampling.{name} must be in [-2, 2]")
    repetition = get("repetition_penalty")
    if repetition is not None and repetition <= 0:
        raise InvalidArgument("sampling.repetition_penalty must be > 0")
    num_sequences = 1
    if s.HasField("num_sequences"):
        num_sequences = s.num_sequences
        if num_sequences == 0:
            raise InvalidArgument("sampling.num_sequences must be greater than zero")
        if caps.HasField("max_num_sequences") and num_sequences > caps.max_num_sequences:
            raise InvalidArgument(
                f"sampling.num_sequences ({num_sequences}) exceeds the advertised maximum ({caps.max_num_sequences})"
            )
    return Sampling(
        temperature=temperature,
        top_p=top_p,
        top_k=None if top_k is None else max(top_k, 0),
        min_p=min_p,
        frequency_penalty=get("frequency_penalty"),
        presence_penalty=get("presence_penalty"),
        repetition_penalty=repetition,
        seed=s.seed if s.HasField("seed") else None,
        num_sequences=num_sequences,
    )


def _parse_stopping(request: pb.GenerateRequest, model: pb.ModelInfo) -> Stopping:
    st = request.stopping
    max_tokens = st.max_tokens if st.HasField("max_tokens") else None
    if max_tokens is not None:
        if max_tokens == 0:
            raise InvalidArgument("stopping.max_tokens must be greater than zero")
        if model.HasField("max_output_tokens") and max_tokens > model.max_output_tokens:
            raise InvalidArgument(
                f"stopping.max_tokens ({max_tokens}) exceeds the model's max_output_tokens ({model.max_output_tokens})"
            )
    min_tokens = st.min_tokens if st.HasField("min_tokens") else 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidArgument("stopping.min_tokens must not exceed max_tokens")
    if max_tokens is None and model.HasField("max_output_tokens") and min_tokens > model.max_output_tokens:
        raise InvalidArgument(
            f"stopping.min_tokens ({min_tokens}) exceeds the model's max_output_tokens ({model.max_output_tokens})"
        )
    texts: list[str] = []
    token_ids: list[int] = []
    for position, condition in enumerate(st.conditions):
        which = condition.WhichOneof("condition")
        if which is None:
            raise InvalidArgument(f"stopping.conditions[{position}] sets neither stop_text nor stop_token_id")
        if which == "stop_text":
            if not condition.stop_text:
                raise InvalidArgument(f"stopping.conditions[{position}].stop_text must be non-empty")
            texts.append(condition.stop_text)
        else:
            token_ids.append(condition.stop_token_id)
    if st.HasField("include_stop_in_output") and not _advertised(model.generation, "supports_stop_in_output"):
        raise InvalidArgument("this model does not advertise include_stop_in_output")
    return Stopping(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_texts=tuple(dict.fromkeys(texts)),
        stop_token_ids=tuple(dict.fromkeys(token_ids)),
        ignore_eos=st.ignore_eos,
        include_stop_in_output=st.include_stop_in_output,
    )


def _parse_logprobs(
    which: str,
    *,
    present: bool,
    wanted: bool,
    selection: pb.CandidateTokenSelection | None,
    caps: pb.LogprobCapabilities | None,
) -> LogprobRequest | None:
    """Logprob options for one side. Candidates imply logprobs unless explicitly refused."""
    if present and not wanted:
        if selection is not None:
            raise InvalidArgument(f"response.{which}_candidates requires return_{which}_logprobs")
        return None
    if not present and selection is None:
        return None
    if caps is None or not (caps.HasField("supported") and caps.supported):
        raise InvalidArgument(f"this model does not advertise {which} logprobs")
    if selection is None:
        return LogprobRequest()
    kind = selection.WhichOneof("selection")
    if kind is None:
        raise InvalidArgument(f"response.{which}_candidates sets no selection")
    mode = _CANDIDATE_MODES[kind]
    if mode not in caps.candidate_selection_modes:
        raise InvalidArgument(f"this model does not advertise {kind} candidate selection for {which} logprobs")
    if kind == "top_n":
        if caps.HasField("max_top_n") and selection.top_n > caps.max_top_n:
            raise InvalidArgument(
                f"response.{which}_candidates.top_n ({selection.top_n}) exceeds the advertised "
                f"maximum ({caps.max_top_n})"
            )
        return LogprobRequest(CandidateSelection(mode, top_n=selection.top_n))
    if kind == "token_ids":
        ids = tuple(dict.fromkeys(selection.token_ids.ids))
        if not ids:
            raise InvalidArgument(f"response.{which}_candidates.token_ids must be non-empty")
        return LogprobRequest(CandidateSelection(mode, token_ids=ids))
    return LogprobRequest(CandidateSelection(mode))


def _parse_guidance(request: pb.GenerateRequest, caps: pb.GenerationCapabilities) -> Guidance | None:
    if not request.HasField("guided"):
        return None
    guided = request.guided
    kind = guided.WhichOneof("guide")
    if kind is None:
        if guided.backend:
            raise InvalidArgument("guided.backend is set but no guide is")
        return None
    mode = _GUIDE_MODES[kind]
    advertised = caps.guided_decoding
    if not (advertised.HasField("supported") and advertised.supported) or mode not in advertised.modes:
        raise InvalidArgument(f"this model does not advertise guided decoding with {kind}")
    if kind == "choice":
        choices = tuple(guided.choice.choices)
        if not choices or any(not c for c in choices):
            raise InvalidArgument("guided.choice.choices must be non-empty strings")
        return Guidance(mode, choices=choices, backend=guided.backend)
    if kind == "json_object":
        return Guidance(mode, backend=guided.backend)
    spec: str = getattr(guided, kind)
    if not spec:
        raise InvalidArgument(f"guided.{kind} must be non-empty")
    if kind in ("json_schema", "structural_tag"):
        try:
            json.loads(spec)
        except ValueError as exc:
            raise InvalidArgument(f"guided.{kind} is not valid JSON: {exc}") from None
    return Guidance(mode, spec=spec, backend=guided.backend)


def parse_media(
    items: Iterable[pb.MediaItem],
    model: pb.ModelInfo,
    *,
    modalities: Container[pb.Modality.ValueType] | None = None,
) -> tuple[Media, ...]:
    """Validate media items (one source each) for a model that advertises multimodal input."""
    media = list(items)
    if not media:
        return ()
    if not (model.HasField("supports_multimodal") and model.supports_multimodal):
        raise InvalidArgument("this model does not advertise multimodal input")
    parsed = []
    for position, item in enumerate(media):
        source = item.WhichOneof("source")
        if source is None:
            raise InvalidArgument(f"media[{position}] sets no source (url, data_uri or raw_bytes)")
        modality = item.modality or pb.MODALITY_IMAGE
        if modality not in pb.Modality.values():
            raise InvalidArgument(f"media[{position}].modality {item.modality} is unknown")
        if modalities is not None and modality not in modalities:
            raise InvalidArgument(f"media[{position}]: modality {pb.Modality.Name(modality)} is not advertised")
        value = getattr(item, source)
        if not value:
            raise InvalidArgument(f"media[{position}].{source} must be non-empty")
        if source == "url" and not value.startswith(("http://", "https://")):
            raise InvalidArgument(f"media[{position}].url must be http(s)://")
        if source == "data_uri" and not value.startswith("data:"):
            raise InvalidArgument(f"media[{position}].data_uri must start with data:")
        parsed.append(
            Media(
                modality=modality,
                url=item.url if source == "url" else None,
                data_uri=item.data_uri if source == "data_uri" else None,
                raw_bytes=item.raw_bytes if source == "raw_bytes" else None,
                mime_type=item.mime_type,
                uuid=item.uuid,
            )
        )
    return tuple(parsed)


__all__ = [
    "ROLE_NAMES",
    "kv_session_from_proto",
    "kv_session_to_proto",
    "new_request_id",
    "parse_generate",
    "parse_media",
]
