"""One real SGLang engine per test module, serving the tiny Llama behind an in-process gateway.

Nothing here imports SGLang at collection: every test module starts with
``pytest.importorskip("sglang")`` and is marked ``sglang``, so the suite skips cleanly where
SGLang (CUDA only) is not installed. The model is the tiny random Llama the vLLM tests build
offline (``openengine_backends.vllm.tiny_model``): no download, so a GPU machine without a model
hub runs these too. The tests compare what the gateway streams with what the same SGLang engine
returns when called directly, so they check the driver's mapping, not the model's numerics.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openengine_gateway.testing import RunningGateway, serve_backends

from tests.engines.streams import MODEL


def server_options(**overrides: Any) -> dict[str, Any]:
    """SGLang server arguments for the tiny model on a shared GPU: a small KV pool, no CUDA graphs."""
    options: dict[str, Any] = {
        "context_length": 512,
        "mem_fraction_static": 0.15,
        "disable_cuda_graph": True,
        "log_level": "error",
    }
    options.update(overrides)
    return options


def option_flags(options: dict[str, Any]) -> list[str]:
    """SGLang server arguments as the command line's ``--name value`` driver options."""
    return [
        part
        for name, value in options.items()
        for part in (f"--{name.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value))
    ]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, built offline (random weights from a fixed seed, a locally trained tokenizer)."""
    from openengine_backends.vllm.tiny_model import build

    return build(tmp_path_factory.mktemp("tiny-llama"))


@contextlib.asynccontextmanager
async def start(tiny_model: Path, **overrides: Any) -> AsyncIterator[RunningGateway]:
    """The gateway serving one SGLang engine on the tiny model as ``tiny``."""
    from openengine_backends.sglang import SglangBackend, SglangSettings

    backend = SglangBackend(SglangSettings(model=str(tiny_model), **server_options(**overrides)))
    async with serve_backends([(MODEL, backend)]) as running:
        yield running


def engine_of(running: RunningGateway) -> Any:
    """The SGLang ``Engine`` behind the gateway, to ask it directly."""
    (engine,) = list(running.gateway.engines)
    return engine.backend.engine  # type: ignore[attr-defined]
