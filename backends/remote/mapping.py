"""Validated requests → the remote's protobuf requests: pure functions, no I/O.

The front gateway parsed and validated the client's request against the capabilities it
copied from the remote, so these functions only restate it: an option the caller left to the
engine's default stays unset, so the remote resolves it exactly as it would have for the
caller. ``parse_generate(generate_request(r, m))`` gives ``r`` back (the tests hold that).
"""

from __future__ import annotations

from collections.abc import Sequence

from openengine_gateway import pb
from openengine_gateway.spi import (
    CandidateSelection,
    ClassifyCall,
    EmbedCall,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    Media,
    ScoreCall,
    TaskContext,
    TaskItem,
)

_GUIDE_FIELDS = {
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA: "json_schema",
    pb.GUIDED_DECODING_MODE_REGEX: "regex",
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR: "ebnf_grammar",
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG: "structural_tag",
}


def generate_request(request: GenerationRequest, model: str) -> pb.GenerateRequest:
    """The remote ``GenerateRequest`` for ``request``, addressed to the remote's ``model``."""
    message = pb.GenerateRequest(request_id=request.request_id, model=model, metadata=dict(request.metadata))
    if request.prompt is not None:
        message.prompt = request.prompt
    else:
        message.token_ids.ids.extend(request.prompt_token_ids or ())
    _sampling(message.sampling, request)
    _stopping(message.stopping, request)
    _logprobs(message.response, request)
    kv = message.kv
    if request.kv_session is not None:
        kv.session.CopyFrom(kv_session_ref(request.kv_session))
    if request.data_parallel_rank is not None:
        kv.data_parallel_rank = request.data_parallel_rank
    if request.bypass_prefix_cache:
        kv.bypass_prefix_cache = True
    if request.cache_salt is not None:
        kv.cache_salt = request.cache_salt
    if request.guidance is not None:
        message.guided.CopyFrom(_guidance(request.guidance))
    message.media.extend(media_item(m) for m in request.media)
    if request.lora_name is not None:
        message.lora_name = request.lora_name
    if request.priority is not None:
        message.priority = request.priority
    return message


def kv_session_ref(session: KvSession) -> pb.KvSessionRef:
    """The ``KvSessionRef`` that hands ``session`` to the remote."""
    ref = pb.KvSessionRef(
        session_id=session.session_id,
        transfer_backend=session.transfer_backend,
        endpoints=[pb.KvEndpoint(host=e.host, port=e.port, protocol=e.protocol) for e in session.endpoints],
        dp_rank=session.dp_rank,
    )
    if session.attributes:
        ref.attributes_struct.update(dict(session.attributes))
    return ref


def _sampling(message: pb.SamplingParams, request: GenerationRequest) -> None:
    sampling = request.sampling
    for name, value in sampling.values().items():  # the knobs the caller set, under the proto's names
        setattr(message, name, value)
    if sampling.seed is not None:
        message.seed = sampling.seed
    if sampling.num_sequences != 1:
        message.num_sequences = sampling.num_sequences


def _stopping(message: pb.StoppingOptions, request: GenerationRequest) -> None:
    stopping = request.stopping
    if stopping.max_tokens is not None:
        message.max_tokens = stopping.max_tokens
    if stopping.min_tokens:
        message.min_tokens = stopping.min_tokens
    message.conditions.extend(pb.StopCondition(stop_text=text) for text in stopping.stop_texts)
    message.conditions.extend(pb.StopCondition(stop_token_id=token) for token in stopping.stop_token_ids)
    if stopping.ignore_eos:
        message.ignore_eos = True
    if stopping.include_stop_in_output:
        message.include_stop_in_output = True


def _logprobs(message: pb.ResponseOptions, request: GenerationRequest) -> None:
    if request.output_logprobs is not None:
        message.return_output_logprobs = True
        _candidates(message.output_candidates, request.output_logprobs)
    if request.prompt_logprobs is not None:
        message.return_prompt_logprobs = True
        _candidates(message.prompt_candidates, request.prompt_logprobs)
        if request.prompt_logprob_start:
            message.prompt_logprob_start = request.prompt_logprob_start


def _candidates(message: pb.CandidateTokenSelection, wanted: LogprobRequest) -> None:
    selection: CandidateSelection | None = wanted.candidates
    if selection is None:
        return
    if selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N:
        message.top_n = selection.top_n
    elif selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        message.token_ids.ids.extend(selection.token_ids)
    else:
        message.all.SetInParent()


def _guidance(guidance: Guidance) -> pb.GuidedDecoding:
    message = pb.GuidedDecoding(backend=guidance.backend)
    if guidance.mode == pb.GUIDED_DECODING_MODE_CHOICE:
        message.choice.choices.extend(guidance.choices)
    elif guidance.mode == pb.GUIDED_DECODING_MODE_JSON_OBJECT:
        message.json_object.SetInParent()
    else:
        setattr(message, _GUIDE_FIELDS[guidance.mode], guidance.spec)
    return message


def media_item(media: Media) -> pb.MediaItem:
    """The wire form of one media input."""
    item = pb.MediaItem(modality=media.modality, mime_type=media.mime_type, uuid=media.uuid)
    if media.url is not None:
        item.url = media.url
    elif media.data_uri is not None:
        item.data_uri = media.data_uri
    elif media.raw_bytes is not None:
        item.raw_bytes = media.raw_bytes
    return item


# -- tasks ------------------------------------------------------------------------------------


def task_context(context: TaskContext, model: str) -> pb.TaskRequestContext:
    """The shared task context, addressed to the remote's ``model``."""
    message = pb.TaskRequestContext(request_id=context.request_id, model=model, metadata=dict(context.metadata))
    if context.lora_name is not None:
        message.lora_name = context.lora_name
    if context.priority is not None:
        message.priority = context.priority
    return message


def task_input(item: TaskItem) -> pb.TaskInput:
    """One task input: text, token ids, or media with an optional prompt."""
    message = pb.TaskInput(item_id=item.item_id)
    if item.media:
        multimodal = message.multimodal
        multimodal.media.extend(media_item(m) for m in item.media)
        if item.text is not None:
            multimodal.text = item.text
        elif item.token_ids is not None:
            multimodal.token_ids.ids.extend(item.token_ids)
    elif item.text is not None:
        message.text = item.text
    else:
        message.token_ids.ids.extend(item.token_ids or ())
    return message


def _inputs(items: Sequence[TaskItem]) -> list[pb.TaskInput]:
    return [task_input(item) for item in items]


def embed_request(call: EmbedCall, model: str) -> pb.EmbedRequest:
    """The remote ``EmbedRequest``; default options stay unset."""
    message = pb.EmbedRequest(context=task_context(call.context, model), inputs=_inputs(call.items))
    options = message.options
    if call.granularity is not None:
        options.granularity = call.granularity
    if call.normalize is not None:
        options.normalize = call.normalize
    if call.dimensions is not None:
        options.dimensions = call.dimensions
    if call.encoding is not None:
        options.encoding = call.encoding
    return message


def classify_request(call: ClassifyCall, model: str) -> pb.ClassifyRequest:
    """The remote ``ClassifyRequest``; default options stay unset."""
    message = pb.ClassifyRequest(context=task_context(call.context, model), inputs=_inputs(call.items))
    if call.granularity is not None:
        message.options.granularity = call.granularity
    if call.semantics is not None:
        message.options.output_semantics = call.semantics
    return message


def score_request(call: ScoreCall, model: str) -> pb.ScoreRequest:
    """The remote ``ScoreRequest``, groups and candidates in order."""
    message = pb.ScoreRequest(context=task_context(call.context, model))
    for group in call.groups:
        message.groups.add(group_id=group.group_id, query=task_input(group.query), candidates=_inputs(group.candidates))
    options = message.options
    if call.granularity is not None:
        options.granularity = call.granularity
    if call.semantics is not None:
        options.output_semantics = call.semantics
    options.normalization = call.normalization
    options.label_token_ids.extend(call.label_token_ids)
    options.instruction = call.instruction
    return message


__all__ = [
    "classify_request",
    "embed_request",
    "generate_request",
    "kv_session_ref",
    "media_item",
    "score_request",
    "task_context",
    "task_input",
]
