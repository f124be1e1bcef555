"""A tiny Llama built offline in seconds: real inference for tests, demos and CI without a model hub.

    python -m openengine_backends.vllm.tiny_model /tmp/tiny-llama
    openengine-gateway --backend vllm --model /tmp/tiny-llama --enforce-eager true --dtype float32

The model has about 0.5M parameters: 2 layers, hidden size 128, two attention heads of size 64
(vLLM's CPU attention needs 64), and a 512-token byte-level BPE tokenizer trained here on a fixed
text. Its weights are random from a fixed seed, scaled so that next-token distributions are
peaked: greedy decoding then has clear winners, so token ids can be compared exactly across
engines. Nothing is downloaded; ``transformers``, ``tokenizers`` and ``torch`` (all dependencies
of vLLM) build it, and they are imported only when a model is built.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

VOCAB_SIZE = 512
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SEED = 1234
WEIGHT_STD = 0.35
"""Standard deviation of the random weights; large enough for peaked distributions."""

_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jumping zebras; "
    "tokens flow through engines, schedulers batch requests, caches keep blocks, and gateways stream "
    "every delta to clients that asked for logprobs, candidates, stop strings or guided json output"
)


def corpus() -> list[str]:
    """A fixed training text: words, numbers, JSON and code-like punctuation."""
    words = _WORDS.split()
    lines = []
    for i in range(400):
        picked = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12))
        lines.append(f"{picked}. {i} + {i * 3 % 97} = {i + i * 3 % 97}")
        lines.append(json.dumps({"id": i, "name": words[i % len(words)], "ok": i % 2 == 0, "tags": [i % 5]}))
    return lines


def build_tokenizer(directory: Path) -> None:
    """Train the byte-level BPE tokenizer and save it in ``transformers`` format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(str(directory))


def build_model(directory: Path, *, max_positions: int = 1024) -> None:
    """Write the random-weight Llama (safetensors, fp32) and its config to ``directory``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, WEIGHT_STD)
    model.save_pretrained(str(directory), safe_serialization=True)


def build(directory: str | Path) -> Path:
    """Build the tokenizer and the model into ``directory`` (created if missing); return it."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(path)
    build_model(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m openengine_backends.vllm.tiny_model DIRECTORY``."""
    parser = argparse.ArgumentParser(description="Write a tiny random-weight Llama model directory.")
    parser.add_argument("directory", help="where to write the model (created if missing)")
    args = parser.parse_args(argv)
    print(build(args.directory))
    return 0


__all__ = ["build", "build_model", "build_tokenizer", "corpus", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
