"""The driver against SGLang 0.5.23's own classes, imported on this CPU (``make .venv-sglang``).

These tests run only where ``sglang`` is installed: in the main venv (vLLM's, which cannot hold
SGLang's triton) pytest does not collect them at all, rather than counting them as skips.
``make test`` runs them with ``.venv-sglang/bin/python -m pytest tests/backends/sglang/real``.

Nothing here runs a model (SGLang's scheduler does not run on this CPU: docs/backends/sglang.md says
why). What runs is SGLang's own code on either side of the model: ``ServerArgs`` resolution; the
``TokenizerManager`` (built for real on the tiny Llama, with no scheduler behind it) tokenizing,
validating and turning the driver's ``GenerateReqInput`` into the ``TokenizedGenerateReqInput`` it
would send, ``SamplingParams`` normalisation and verification, and building the output dictionaries
the driver reads from what the ``DetokenizerManager`` makes of scheduler messages; the scheduler's
``Req`` stop checks; the grammar backends; the radix cache's KV-event recorder and the ZMQ publisher.
Only the model's tokens, logprobs and finish decisions are played by the tests.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]

CONTEXT_LENGTH = 256
"""The tiny Llama's served context (its config allows 1024)."""
RESERVED_OUTPUT = 5
"""``max_req_input_len = max_req_len - 5`` (``managers/tp_worker.py``), with ``max_req_len = context - 1``
when the KV pool holds a whole context, as it does for this model."""


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (random weights, locally trained tokenizer), built offline."""
    from openengine_backends.vllm.tiny_model import build

    return build(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def server_args(tiny_model: Path) -> Any:
    """SGLang's ``ServerArgs`` from the driver's ``server_kwargs``, resolved and published as
    ``Engine`` does before it starts its processes (``entrypoints/engine.py _launch_subprocesses``)."""
    from openengine_backends.sglang.server_args import server_kwargs
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**server_kwargs(str(tiny_model), {"context_length": str(CONTEXT_LENGTH), "device": "cpu"}))
    args.resolve_once()
    args.check_server_args()
    publish(args, role="tokenizer")
    return args


@pytest.fixture(scope="session")
def tokenizer_manager(server_args: Any) -> Iterator[Any]:
    """SGLang's real ``TokenizerManager`` for the tiny Llama, with no scheduler behind it.

    ``max_req_input_len`` is what the scheduler would report for a KV pool larger than the
    context (``Engine`` copies it from the scheduler's info)."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import PortArgs

    manager = TokenizerManager(server_args, PortArgs.init_new(server_args))
    manager.max_req_input_len = manager.context_len - 1 - RESERVED_OUTPUT
    yield manager


@pytest.fixture(scope="session")
def internal_state(server_args: Any) -> dict[str, Any]:
    """The resolved server arguments, as the scheduler's ``get_internal_state`` starts its answer
    (``scheduler_components/internal_state.py``: ``resolved_server_args_dict()``)."""
    from sglang.srt.runtime_context import get_context

    return dict(get_context().resolved_server_args_dict())
