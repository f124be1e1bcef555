"""The parts of SGLang 0.5.23's API the driver touches, faked, and their installation as ``sglang``.

Shapes follow SGLang's source: ``srt/server_args.py`` (a msgspec ``ServerArgs`` whose field
names are ``__struct_fields__`` and whose ``add_cli_args`` registers booleans as ``store_true``
and ``--model-path`` as required), ``srt/managers/io_struct.py`` (``EmbeddingReqInput``,
``LoRAUpdateOutput``), ``srt/lora/lora_registry.py`` (``LoRARef``), ``srt/managers/
load_snapshot.py`` (``LoadSnapshot``) and a fast Hugging Face tokenizer. ``install`` makes
``import sglang`` and the submodules the driver imports find these and ``fake_engine.Engine``.
"""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

VERSION = "0.5.23"
VOCAB = 128
EOS = 1
"""``</s>``: a special token, decoded to nothing with ``skip_special_tokens``."""


class Tokenizer:
    """A character tokenizer shaped like a fast Hugging Face tokenizer: printable ASCII is its id."""

    is_fast = True
    eos_token_id = EOS
    additional_stop_token_ids = None

    bos: int | None = None
    """A BOS id to start every encoding with (special tokens on); none by default."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        start = [self.bos] if self.bos is not None and add_special_tokens else []
        return start + [ord(c) if 32 <= ord(c) < 127 else ord("?") for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(piece(i) if i != EOS or not skip_special_tokens else "" for i in ids)


def piece(token_id: int) -> str:
    """One token's text (``</s>`` for EOS when special tokens are kept)."""
    if token_id == EOS:
        return "</s>"
    return chr(token_id) if 32 <= token_id < 127 else ""


# -- server arguments --------------------------------------------------------------------

FIELDS: dict[str, tuple[type, Any]] = {
    "model_path": (str, None),
    "context_length": (int, None),
    "page_size": (int, None),
    "max_running_requests": (int, None),
    "max_total_tokens": (int, None),
    "chunked_prefill_size": (int, None),
    "max_prefill_tokens": (int, 16384),
    "disaggregation_mode": (str, "null"),
    "disaggregation_transfer_backend": (str, "mooncake"),
    "disaggregation_bootstrap_port": (int, 8998),
    "host": (str, "127.0.0.1"),
    "enable_lora": (bool, None),
    "lora_paths": (list, None),
    "max_loras_per_batch": (int, 8),
    "schedule_policy": (str, "fcfs"),
    "enable_priority_scheduling": (bool, False),
    "schedule_low_priority_values_first": (bool, False),
    "dp_size": (int, 1),
    "attn_dp_size": (int, 1),
    "enable_dp_attention": (bool, False),
    "dcp_size": (int, 1),
    "tp_size": (int, 1),
    "pp_size": (int, 1),
    "kv_events_config": (str, None),
    "grammar_backend": (str, None),
    "skip_tokenizer_init": (bool, False),
    "incremental_streaming_output": (bool, False),
    "is_embedding": (bool, False),
    "enable_deterministic_inference": (bool, False),
    "tokenizer_mode": (str, "auto"),
    "reasoning_parser": (str, None),
    "tool_call_parser": (str, None),
    "log_level": (str, "error"),
    "sampling_defaults": (str, "model"),
    "speculative_algorithm": (str, None),
    "speculative_num_steps": (int, None),
    "speculative_eagle_topk": (int, None),
    "speculative_num_draft_tokens": (int, None),
}


class ServerArgs:
    """``sglang.srt.server_args.ServerArgs``: its field names and its command-line registration."""

    __struct_fields__ = tuple(FIELDS)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for name, (kind, default) in FIELDS.items():
            flag = "--" + name.replace("_", "-")
            if name == "model_path":
                parser.add_argument(flag, "--model", type=str, required=True)
            elif kind is bool:
                parser.add_argument(flag, action="store_true", default=default)
            elif kind is list:
                parser.add_argument(flag, type=str, nargs="*", default=default)
            elif name == "grammar_backend":
                choices = ["xgrammar", "outlines", "llguidance", "none"]
                parser.add_argument(flag, type=str, choices=choices, default=default)
            else:
                parser.add_argument(flag, type=kind, default=default)


def resolved(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every field, as SGLang's resolution leaves it (unknown names are a ``TypeError``, like msgspec)."""
    unknown = set(kwargs) - set(FIELDS)
    if unknown:
        raise TypeError(f"Unexpected keyword argument {sorted(unknown)[0]!r}")
    args = {name: default for name, (_, default) in FIELDS.items()} | kwargs
    args["grammar_backend"] = args["grammar_backend"] or "xgrammar"
    args["page_size"] = args["page_size"] or 1
    args["chunked_prefill_size"] = args["chunked_prefill_size"] or 8192
    args["enable_lora"] = bool(args["enable_lora"] or args["lora_paths"])
    resolve_dp_attention(args)
    return args


def resolve_dp_attention(args: dict[str, Any]) -> None:
    """``arg_groups/parallel_hook.py``: ``--dp-size N --enable-dp-attention`` becomes ``attn_dp_size=N,
    dp_size=1``, replicas beside attention DP are refused, and ``ServerArgs.resolved_dict`` reports
    ``enable_dp_attention`` as whether attention DP runs."""
    if args["enable_dp_attention"] and args["attn_dp_size"] == 1:
        args["attn_dp_size"], args["dp_size"] = args["dp_size"], 1
    if args["attn_dp_size"] > 1 and args["dp_size"] > 1:
        raise ValueError("data-parallel replicas combined with attention data parallelism are not supported.")
    args["enable_dp_attention"] = args["attn_dp_size"] > 1


def num_dp_ranks(args: dict[str, Any]) -> int:
    """``runtime_context.py`` ``num_dp_ranks_of``: replicas times attention-DP groups."""
    return int(args["dp_size"]) * int(args["attn_dp_size"])


# -- request and result records ----------------------------------------------------------


class HTTPException(Exception):
    """``fastapi.HTTPException``: what SGLang raises for a non-streamed request aborted with a status other
    than 400 (``managers/tokenizer_manager.py``)."""

    def __init__(self, status_code: int, detail: Any = None) -> None:
        super().__init__(status_code, detail)
        self.status_code = status_code
        self.detail = detail


@dataclass
class GenerateReqInput:
    """``io_struct.GenerateReqInput`` (a single request; the fields the driver may set)."""

    rid: str | None = None
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | None = None
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    routed_dp_rank: int | None = None
    disagg_prefill_dp_rank: int | None = None
    priority: int | None = None
    cache_salt: str | None = None


@dataclass
class EmbeddingReqInput:
    """``io_struct.EmbeddingReqInput`` (the fields the driver sets)."""

    rid: str | list[str] | None = None
    text: str | list[str] | list[list[str]] | None = None
    input_ids: list[int] | None = None
    image_data: Any = None
    is_cross_encoder_request: bool = False
    lora_path: str | None = None
    priority: int | None = None
    dimensions: int | None = None


@dataclass
class LoRAUpdateOutput:
    """``io_struct.LoRAUpdateOutput``."""

    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, Any] | None = None


@dataclass(frozen=True)
class LoRARef:
    """``lora_registry.LoRARef``."""

    lora_id: str
    lora_name: str | None = None
    lora_path: str | None = None
    pinned: bool | None = None


@dataclass
class LoadSnapshot:
    """``load_snapshot.LoadSnapshot`` (its core fields)."""

    timestamp: float = 0.0
    dp_rank: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_used_tokens: int = 0
    max_total_num_tokens: int = 0
    max_running_requests: int = 0


@dataclass
class ScoreResult:
    """``tokenizer_manager_score_mixin.ScoreResult``."""

    scores: list[list[float]]
    prompt_tokens: int = 0
    token_logprobs: list[list[float]] | None = field(default=None)


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Make ``import sglang`` (and the submodules the driver imports) find the fake; the ``sglang`` module."""
    from . import fake_engine

    def module(name: str, **members: Any) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__dict__.update(members)
        return made

    sglang = module("sglang", __version__=VERSION, Engine=fake_engine.Engine)
    modules = {
        "sglang": sglang,
        "sglang.srt": module("sglang.srt"),
        "sglang.srt.server_args": module("sglang.srt.server_args", ServerArgs=ServerArgs),
        "sglang.srt.managers": module("sglang.srt.managers"),
        "sglang.srt.managers.io_struct": module(
            "sglang.srt.managers.io_struct", EmbeddingReqInput=EmbeddingReqInput, GenerateReqInput=GenerateReqInput
        ),
    }
    for name, made in modules.items():
        monkeypatch.setitem(sys.modules, name, made)
    fake_engine.reset()
    return sglang


__all__ = [
    "EOS",
    "FIELDS",
    "VERSION",
    "VOCAB",
    "EmbeddingReqInput",
    "GenerateReqInput",
    "HTTPException",
    "LoRARef",
    "LoRAUpdateOutput",
    "LoadSnapshot",
    "ScoreResult",
    "ServerArgs",
    "Tokenizer",
    "install",
    "num_dp_ranks",
    "piece",
    "resolve_dp_attention",
    "resolved",
]
