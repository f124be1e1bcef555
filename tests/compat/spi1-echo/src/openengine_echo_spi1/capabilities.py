"""What the echo engine advertises: the one table discovery returns and the gateway enforces.

Everything the driver does not implement is an explicit ``False`` (or ``supported=False``),
so the gateway rejects such requests before they reach it; nothing is silently ignored.
Sampling knobs need no entry: the model puts all probability on one token, so temperature,
top-k/p and penalties cannot change what it generates.
"""

from __future__ import annotations

from openengine_gateway import pb

from .settings import EchoSettings

PARALLELISM = pb.ParallelismInfo(
    tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, data_parallel_start_rank=0
)


def model_info(settings: EchoSettings) -> pb.ModelInfo:
    """The model's capabilities and limits."""
    unsupported = pb.LogprobCapabilities(supported=False)
    return pb.ModelInfo(
        model_id=settings.model,
        max_context_length=settings.max_context_length,
        max_output_tokens=settings.max_context_length - 1,
        max_running_requests=1 << 20,
        supports_text_input=True,
        supports_token_ids_input=True,
        generation=pb.GenerationCapabilities(
            prompt_logprobs=unsupported,
            output_logprobs=unsupported,
            guided_decoding=pb.GuidedDecodingCapabilities(supported=False),
            max_num_sequences=1,
            supports_priority=False,
            supports_stop_in_output=True,
            supports_cache_salt=False,
            supports_prefix_cache_bypass=False,
        ),
        supports_lora=False,
        supports_multimodal=False,
    )


__all__ = ["PARALLELISM", "model_info"]
