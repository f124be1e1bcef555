"""An independent forward pass of the tiny model with ``transformers`` (fp32), and a LoRA adapter.

The engine tests compare what the gateway streams from vLLM with these numbers: greedy token ids
exactly, logprobs (prompt and output, candidates included) within ``TOLERANCE``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

TOLERANCE = 1e-4
"""Absolute logprob tolerance between vLLM and transformers (both fp32)."""


@dataclass(frozen=True)
class Step:
    """One greedy position: the chosen token, its logprob and rank, and the full distribution."""

    token_id: int
    logprob: float
    rank: int
    logprobs: torch.Tensor


def rank_of(logprobs: torch.Tensor, token_id: int) -> int:
    """1-based vocabulary rank: one plus the number of strictly more likely tokens."""
    return int((logprobs > logprobs[token_id]).sum().item()) + 1


class Reference:
    """The tiny model in ``transformers``, optionally with LoRA deltas merged into its weights."""

    def __init__(self, path: Path, lora: Path | None = None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        if lora is not None:
            merge_lora(self.model, lora)

    def encode(self, text: str) -> list[int]:
        """Token ids as vLLM's renderer makes them (special tokens added: BOS)."""
        ids: list[int] = self.tokenizer(text)["input_ids"]
        return ids

    @torch.no_grad()
    def distributions(self, ids: Sequence[int]) -> torch.Tensor:
        """Log-softmax over the vocabulary after each position, ``[len(ids), vocab]``."""
        logits = self.model(torch.tensor([list(ids)])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def greedy(self, prompt: Sequence[int], steps: int) -> list[Step]:
        """``steps`` greedy tokens after ``prompt`` (EOS not special: the tests ignore it)."""
        ids = list(prompt)
        result = []
        for _ in range(steps):
            row = self.distributions(ids)[-1]
            token_id = int(torch.argmax(row).item())
            result.append(Step(token_id, float(row[token_id]), rank_of(row, token_id), row))
            ids.append(token_id)
        return result

    def prompt_steps(self, prompt: Sequence[int]) -> list[Step]:
        """Each prompt token after the first, scored given the tokens before it."""
        rows = self.distributions(prompt)
        return [
            Step(
                token_id, float(rows[position - 1][token_id]), rank_of(rows[position - 1], token_id), rows[position - 1]
            )
            for position, token_id in enumerate(prompt)
            if position > 0
        ]


LORA_RANK, LORA_ALPHA, LORA_TARGETS = 4, 8, ("q_proj", "v_proj")


def write_lora(base: Path, directory: Path, *, seed: int = 7, scale: float = 0.5) -> Path:
    """A PEFT-format LoRA adapter for the tiny model (random, fixed seed) that changes its output."""
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.split(".")[-1] in LORA_TARGETS:
            out_features, in_features = module.weight.shape
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, in_features, generator=generator) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, LORA_RANK, generator=generator) * scale
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": LORA_RANK,
        "lora_alpha": LORA_ALPHA,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(LORA_TARGETS),
        "fan_in_fan_out": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


@torch.no_grad()
def merge_lora(model: torch.nn.Module, adapter: Path) -> None:
    """Add ``alpha / r * B @ A`` to every targeted weight, as LoRA defines it."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    modules = dict(model.named_modules())
    for key, a in tensors.items():
        if key.endswith("lora_A.weight"):
            name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = tensors[key.replace("lora_A", "lora_B")]
            modules[name].weight += (LORA_ALPHA / LORA_RANK) * (b @ a)
