"""``MockSettings``: every knob of the simulated engine, each capability switchable.

Switches are named ``enable_*`` and map one-to-one onto what the engine advertises, so a
test can turn a capability off and exercise the gateway's rejection path. Limits are
per data-parallel rank unless a field says otherwise.
"""

from __future__ import annotations

from typing import Literal

from openengine_gateway.spi import BackendSettings
from pydantic import Field, field_validator, model_validator

GuidedMode = Literal["regex", "choice"]
Role = Literal["aggregated", "prefill", "decode"]


class MockSettings(BackendSettings):
    """Options of the ``mock`` backend (``plugins.toml`` or ``--option value`` flags)."""

    model: str = "mock-model"
    role: Role = "aggregated"
    seed: int = 0
    """Seeds the pseudo-model's tables, the task weights and unseeded sampling."""

    # -- limits ---------------------------------------------------------------------------
    max_context_length: int = Field(default=2048, gt=1)
    max_output_tokens: int = Field(default=1024, gt=0)
    max_running_requests: int = Field(default=64, gt=0)
    max_batched_tokens: int = Field(default=8192, gt=0)
    """Tokens one scheduler step computes; longer prompts are prefilled in chunks."""
    kv_block_size: int = Field(default=16, gt=0)
    total_kv_blocks: int = Field(default=1024, gt=0)
    max_num_sequences: int = Field(default=8, gt=0)
    max_top_n: int = Field(default=20, gt=0)
    data_parallel_size: int = Field(default=1, gt=0)
    """Independent scheduler + KV cache instances; requests go to the named or least-loaded one."""

    # -- timing model (seconds; zero makes every step yield once and continue) ---------------
    prefill_time_per_token_s: float = Field(default=0.0, ge=0)
    decode_time_per_step_s: float = Field(default=0.0, ge=0)

    # -- faults (a test's, not an upstream behaviour) ----------------------------------------
    fault_rate: float = Field(default=0.0, ge=0, le=1)
    """The share of accepted Generate requests that end at once with a retryable INTERNAL engine error,
    drawn from the seed: an engine failing some requests, for a canary's error-rate limit."""

    # -- capability switches ----------------------------------------------------------------
    enable_text_input: bool = True
    enable_token_ids_input: bool = True
    enable_output_logprobs: bool = True
    enable_prompt_logprobs: bool = True
    guided_decoding_modes: tuple[GuidedMode, ...] = ("regex", "choice")
    """Empty turns guided decoding off."""
    enable_priority: bool = True
    enable_stop_in_output: bool = True
    enable_cache_salt: bool = True
    enable_prefix_cache_bypass: bool = True
    enable_lora: bool = True
    max_loras: int = Field(default=4, gt=0)
    enable_multimodal: bool = False
    enable_embed: bool = True
    enable_classify: bool = True
    enable_score: bool = True
    enable_kv_events: bool = True
    enable_runtime_events: bool = True

    # -- tasks ----------------------------------------------------------------------------
    embedding_dimension: int = Field(default=64, gt=0)
    classify_labels: tuple[str, ...] = ("negative", "neutral", "positive")
    max_task_batch_size: int = Field(default=64, gt=0)

    # -- events and KV transfer -----------------------------------------------------------
    event_queue_size: int = Field(default=4096, gt=0)
    """KV-event batches / runtime events buffered for a slow consumer before its stream fails."""
    kv_transfer_host: str = "127.0.0.1"
    kv_transfer_port: int = Field(default=0, ge=0, le=65535)
    """The prefill role's loopback transfer server; 0 picks a free port."""
    kv_session_timeout_s: float = Field(default=60.0, gt=0)
    """A prefilled session not pulled by a decode engine within this time is released."""
    kv_transfer_timeout_s: float = Field(default=5.0, gt=0)
    """How long a decode engine waits for a pull before failing with KV_TRANSFER_FAILED."""

    @field_validator("guided_decoding_modes", "classify_labels", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """A command-line flag gives one string: ``--guided-decoding-modes regex,choice`` (or ``""``)."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="after")
    def _consistent(self) -> MockSettings:
        if not (self.enable_text_input or self.enable_token_ids_input):
            raise ValueError("enable at least one of enable_text_input and enable_token_ids_input")
        if self.max_output_tokens >= self.max_context_length:
            raise ValueError("max_output_tokens must be below max_context_length")
        if self.total_kv_blocks * self.kv_block_size < self.max_context_length:
            raise ValueError("total_kv_blocks * kv_block_size must hold max_context_length tokens")
        if not self.classify_labels or len(set(self.classify_labels)) != len(self.classify_labels):
            raise ValueError("classify_labels must be non-empty and unique")
        if len(set(self.guided_decoding_modes)) != len(self.guided_decoding_modes):
            raise ValueError("guided_decoding_modes has duplicates")
        return self


__all__ = ["GuidedMode", "MockSettings", "Role"]
