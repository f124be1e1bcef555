"""The contract's LoRA adapter rules: what a load request must name, and the adapter's wire form.

``lora_id`` is positive, ``lora_name`` non-empty, ``source_path`` absolute (no NUL, which no path
can hold). What is checked against the filesystem and the registered adapters (the path is a
directory inside the allowed roots; ids, names and paths are unique) is ``core.lora``'s.
"""

from __future__ import annotations

import os

from .. import pb
from ..errors import InvalidArgument
from ..spi.requests import LoraAdapter


def adapter_to_proto(adapter: LoraAdapter) -> pb.LoraAdapter:
    """The wire form of a registered adapter."""
    return pb.LoraAdapter(lora_id=adapter.lora_id, lora_name=adapter.lora_name, source_path=adapter.source_path)


def is_absolute_path(path: str) -> bool:
    """Whether ``path`` can name an adapter directory at all: absolute, and no NUL."""
    return os.path.isabs(path) and "\0" not in path


def check_adapter(requested: pb.LoraAdapter) -> None:
    """Reject a load request whose id, name or path the contract refuses, whatever the filesystem holds."""
    if requested.lora_id <= 0:
        raise InvalidArgument("adapter.lora_id must be positive")
    if not requested.lora_name:
        raise InvalidArgument("adapter.lora_name must be non-empty")
    if not requested.source_path or not is_absolute_path(requested.source_path):
        raise InvalidArgument("adapter.source_path must be an absolute directory path")


__all__ = ["adapter_to_proto", "check_adapter", "is_absolute_path"]
