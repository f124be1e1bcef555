"""Every public module keeps ``__all__`` honest: each name exists, and no public name is missing."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "openengine_gateway.config",
    "openengine_gateway.engines",
    "openengine_gateway.errors",
    "openengine_gateway.launch",
    "openengine_gateway.plugins",
    "openengine_gateway.reload",
    "openengine_gateway.routes",
    "openengine_gateway.routes_cli",
    "openengine_gateway.spi",
    "openengine_gateway.spi.adapters",
    "openengine_gateway.spi.backend",
    "openengine_gateway.spi.background",
    "openengine_gateway.spi.events",
    "openengine_gateway.spi.kv_events",
    "openengine_gateway.spi.requests",
    "openengine_gateway.spi.sessions",
    "openengine_gateway.spi.streaming",
    "openengine_gateway.spi.vocabulary",
    "openengine_gateway.spi.zmq_kv",
    "openengine_gateway.spi.zmq_kv.events",
    "openengine_gateway.spi.zmq_kv.replay",
    "openengine_gateway.spi.zmq_kv.sources",
    "openengine_gateway.contract.capabilities",
    "openengine_gateway.contract.generation",
    "openengine_gateway.contract.intersection",
    "openengine_gateway.contract.kv_wire",
    "openengine_gateway.contract.lora",
    "openengine_gateway.contract.ranks",
    "openengine_gateway.contract.stream",
    "openengine_gateway.contract.tasks",
    "openengine_gateway.core.fanout",
    "openengine_gateway.core.kv_event_hub",
    "openengine_gateway.core.mirror",
    "openengine_gateway.core.registry",
    "openengine_gateway.core.runtime_event_hub",
    "openengine_gateway.testing",
    "openengine_gateway.bench",
    "openengine_gateway.bench.arrivals",
    "openengine_gateway.bench.cli",
    "openengine_gateway.bench.errors",
    "openengine_gateway.bench.plots",
    "openengine_gateway.bench.progress",
    "openengine_gateway.bench.prompts",
    "openengine_gateway.bench.records",
    "openengine_gateway.bench.report",
    "openengine_gateway.bench.runner",
    "openengine_gateway.bench.stats",
    "openengine_gateway.bench.workload",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_public_definitions_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "duplicates in __all__"
    for member in exported:
        assert hasattr(module, member), f"{name}.__all__ lists missing {member!r}"
    defined_here = {
        member
        for member, value in vars(module).items()
        if not member.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == name
    }
    assert defined_here <= exported, f"{name} does not export {sorted(defined_here - exported)}"


def test_spi_exports_what_a_driver_needs() -> None:
    """The SPI package re-exports every public name of its modules (a plugin imports only it)."""
    spi = importlib.import_module("openengine_gateway.spi")
    for part in ("adapters", "backend", "background", "events", "kv_events", "requests", "sessions", "streaming"):
        module = importlib.import_module(f"openengine_gateway.spi.{part}")
        assert set(module.__all__) <= set(spi.__all__), part
