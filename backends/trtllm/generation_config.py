"""The model's ``generation_config.json``, read the way vLLM reads it for its sampling defaults.

TensorRT-LLM's ``LLM`` does not apply a model's generation config to requests; the driver reads
it once at start (``sampling.sampling_defaults`` picks the defaults). Hugging Face's
``GenerationConfig`` is TensorRT-LLM's own dependency, imported only when the file exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FILE_NAME = "generation_config.json"


def read(model_dir: Path) -> dict[str, Any]:
    """The file's values that differ from Hugging Face's defaults (``to_diff_dict``); {} without one."""
    if not (model_dir / FILE_NAME).is_file():
        return {}
    from transformers import GenerationConfig

    diff: dict[str, Any] = GenerationConfig.from_pretrained(str(model_dir)).to_diff_dict()
    return diff


__all__ = ["FILE_NAME", "read"]
