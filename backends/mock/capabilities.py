"""What the mock engine advertises, derived from its settings alone.

This is the one table that discovery returns and the gateway enforces, so every field
states exactly what the settings enable: a disabled feature is an explicit ``False`` (or
``supported = False``), never an absent field, and limits are always reported.
"""

from __future__ import annotations

from openengine_gateway import pb

from .settings import MockSettings
from .tokenizer import VOCAB_SIZE
from .transfer import PROTOCOL, TRANSFER_BACKEND

ROLES = {
    "aggregated": pb.ENGINE_ROLE_AGGREGATED,
    "prefill": pb.ENGINE_ROLE_PREFILL,
    "decode": pb.ENGINE_ROLE_DECODE,
}
_GUIDED_MODES = {"regex": pb.GUIDED_DECODING_MODE_REGEX, "choice": pb.GUIDED_DECODING_MODE_CHOICE}
_CANDIDATE_MODES = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)
_MODALITIES = (pb.MODALITY_IMAGE, pb.MODALITY_VIDEO, pb.MODALITY_AUDIO)


def _logprobs(enabled: bool, max_top_n: int) -> pb.LogprobCapabilities:
    if not enabled:
        return pb.LogprobCapabilities(supported=False)
    return pb.LogprobCapabilities(supported=True, candidate_selection_modes=_CANDIDATE_MODES, max_top_n=max_top_n)


def _input_types(settings: MockSettings) -> list[pb.TaskInputType.ValueType]:
    types: list[pb.TaskInputType.ValueType] = []
    if settings.enable_text_input:
        types.append(pb.TASK_INPUT_TYPE_TEXT)
    if settings.enable_token_ids_input:
        types.append(pb.TASK_INPUT_TYPE_TOKEN_IDS)
    if settings.enable_multimodal:
        types.append(pb.TASK_INPUT_TYPE_MULTIMODAL)
    return types


def _tasks(settings: MockSettings) -> pb.TaskCapabilities:
    types = _input_types(settings)
    modalities = _MODALITIES if settings.enable_multimodal else ()
    granularities = (pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, pb.TASK_OUTPUT_GRANULARITY_TOKEN)
    batch = settings.max_task_batch_size
    lora = settings.enable_lora
    tasks = pb.TaskCapabilities()
    if settings.enable_embed:
        tasks.embed.CopyFrom(
            pb.EmbedCapabilities(
                supported=True,
                input_types=types,
                granularities=granularities,
                encodings=(pb.EMBEDDING_ENCODING_DENSE, pb.EMBEDDING_ENCODING_SPARSE),
                dimension=settings.embedding_dimension,
                max_batch_size=batch,
                supports_priority=False,
                supports_lora=lora,
                supports_normalization=True,
                supports_dimension_override=True,
                modalities=modalities,
            )
        )
    else:
        tasks.embed.supported = False
    if settings.enable_classify:
        tasks.classify.CopyFrom(
            pb.ClassifyCapabilities(
                supported=True,
                input_types=types,
                granularities=granularities,
                semantics=(
                    pb.TASK_VALUE_SEMANTICS_LOGITS,
                    pb.TASK_VALUE_SEMANTICS_PROBABILITIES,
                    pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES,
                ),
                max_batch_size=batch,
                supports_priority=False,
                supports_lora=lora,
                modalities=modalities,
            )
        )
    else:
        tasks.classify.supported = False
    if settings.enable_score:
        tasks.score.CopyFrom(
            pb.ScoreCapabilities(
                supported=True,
                input_types=types,
                granularities=(pb.TASK_OUTPUT_GRANULARITY_SEQUENCE,),
                semantics=(
                    pb.TASK_VALUE_SEMANTICS_SIMILARITY,
                    pb.TASK_VALUE_SEMANTICS_PROBABILITIES,
                    pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES,
                ),
                normalizations=(pb.SCORE_NORMALIZATION_NONE, pb.SCORE_NORMALIZATION_SOFTMAX),
                supports_label_token_scoring=True,
                supports_instruction=True,
                max_groups=batch,
                max_candidates_per_group=batch,
                supports_priority=False,
                supports_lora=lora,
                higher_is_better=True,
                modalities=modalities,
                max_label_token_ids=VOCAB_SIZE,
            )
        )
    else:
        tasks.score.supported = False
    return tasks


def model_info(settings: MockSettings) -> pb.ModelInfo:
    """The ``ModelInfo`` of a mock engine with ``settings`` (limits summed over DP ranks)."""
    ranks = settings.data_parallel_size
    modes = [_GUIDED_MODES[mode] for mode in settings.guided_decoding_modes]
    generation = pb.GenerationCapabilities(
        prompt_logprobs=_logprobs(settings.enable_prompt_logprobs, settings.max_top_n),
        output_logprobs=_logprobs(settings.enable_output_logprobs, settings.max_top_n),
        guided_decoding=pb.GuidedDecodingCapabilities(supported=bool(modes), modes=modes),
        max_num_sequences=settings.max_num_sequences,
        supports_priority=settings.enable_priority,
        supports_stop_in_output=settings.enable_stop_in_output,
        supports_cache_salt=settings.enable_cache_salt,
        supports_prefix_cache_bypass=settings.enable_prefix_cache_bypass,
    )
    return pb.ModelInfo(
        model_id=settings.model,
        max_context_length=settings.max_context_length,
        max_output_tokens=settings.max_output_tokens,
        kv_block_size=settings.kv_block_size,
        total_kv_blocks=settings.total_kv_blocks * ranks,
        max_running_requests=settings.max_running_requests * ranks,
        max_batched_tokens=settings.max_batched_tokens,
        supports_text_input=settings.enable_text_input,
        supports_token_ids_input=settings.enable_token_ids_input,
        generation=generation,
        supports_lora=settings.enable_lora,
        supports_multimodal=settings.enable_multimodal,
        tasks=_tasks(settings),
    )


def kv_connector(settings: MockSettings, endpoint: pb.KvEndpoint | None) -> pb.KvConnectorInfo | None:
    """The loopback transfer connector of a prefill or decode engine; None when aggregated."""
    if settings.role == "aggregated":
        return None
    return pb.KvConnectorInfo(
        enabled=True,
        transfer_backend=TRANSFER_BACKEND,
        local_endpoints=[endpoint] if endpoint is not None else [],
        supported_protocols=[PROTOCOL],
        supports_remote_prefill=settings.role == "decode",
        supports_decode_pull=True,
        supports_abort_cleanup=True,
        supports_drain=True,
        schema_version=1,
    )


def parallelism(settings: MockSettings) -> pb.ParallelismInfo:
    """One process, no tensor or pipeline parallelism, ``data_parallel_size`` ranks from 0."""
    return pb.ParallelismInfo(
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=settings.data_parallel_size,
        data_parallel_start_rank=0,
    )


__all__ = ["ROLES", "kv_connector", "model_info", "parallelism"]
