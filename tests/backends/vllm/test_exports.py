"""Every module of the vLLM driver keeps ``__all__`` honest (no vLLM import needed)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "capabilities",
    "engine",
    "engine_args",
    "mapping",
    "outputs",
    "pooling",
    "settings",
    "sharing",
    "tiny_model",
]


@pytest.mark.parametrize("name", [f"openengine_backends.vllm.{m}" for m in MODULES])
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
