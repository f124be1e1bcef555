"""Every module of the TensorRT-LLM driver keeps ``__all__`` honest (no TensorRT-LLM needed)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "capabilities",
    "engine",
    "generation_config",
    "kv_events",
    "llm_args",
    "loras",
    "mapping",
    "outputs",
    "refusals",
    "sampling",
    "settings",
]


@pytest.mark.parametrize("name", [f"openengine_backends.trtllm.{m}" for m in MODULES])
def test_all_lists_exactly_the_public_definitions(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, member) for member in exported)
    defined = {
        member
        for member, value in vars(module).items()
        if not member.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == name
    }
    assert defined <= exported, sorted(defined - exported)
