"""What ``engine.py`` and ``tasks.py`` call on SGLang's ``Engine`` and ``TokenizerManager``, against
their real signatures, and what the driver reads from the objects they return."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from openengine_backends.sglang import capabilities

PROMPT = [5, 6, 7]


@pytest.mark.parametrize(
    ("owner", "method", "args", "kwargs"),
    [
        ("engine", "async_score", (), {"query": "q", "items": ["a"], "label_token_ids": [1], "apply_softmax": True}),
        (
            "engine",
            "async_score",
            (),
            {"query": PROMPT, "items": [PROMPT], "label_token_ids": [1], "apply_softmax": False},
        ),
        ("engine", "async_load_lora_adapter", ("name", "/path"), {}),
        ("engine", "async_unload_lora_adapter", ("name",), {}),
        ("engine", "get_all_child_pids", (), {}),
        ("engine", "shutdown", (), {}),
        ("manager", "generate_request", (object(), None), {}),
        ("manager", "abort_request", ("rid",), {}),
        ("manager", "abort_request", (), {"abort_all": True}),
        ("manager", "get_loads", (), {}),
        ("manager", "get_internal_state", (), {}),
        ("manager", "auto_create_handle_loop", (), {}),
        ("manager", "set_server_stop_hook", (print,), {}),
        ("manager", "dump_requests_before_crash", (), {}),
    ],
)
def test_the_driver_calls_sglang_as_its_signatures_allow(
    owner: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    cls = Engine if owner == "engine" else TokenizerManager
    inspect.signature(getattr(cls, method)).bind(object(), *args, **kwargs)


def test_load_snapshots_per_rank() -> None:
    """``get_loads()`` returns one ``LoadSnapshot`` per DP rank (``managers/load_snapshot.py``)."""
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    snapshots = [
        LoadSnapshot(timestamp=12.5, dp_rank=1, num_running_reqs=2, num_waiting_reqs=1, num_used_tokens=33,
                     max_total_num_tokens=4096),
        LoadSnapshot(timestamp=12.0, dp_rank=0, num_running_reqs=1, num_waiting_reqs=0, num_used_tokens=16,
                     max_total_num_tokens=4096),
    ]  # fmt: skip
    load = capabilities.load_info(snapshots, page_size=16, kv_sessions=0)
    assert [rank.data_parallel_rank for rank in load.ranks] == [0, 1]
    assert [rank.used_kv_blocks for rank in load.ranks] == [1, 3], "used tokens in pages, rounded up"
    assert (load.running_requests, load.queued_requests, load.total_kv_blocks) == (3, 1, 512)
    assert load.timestamp_unix_nanos == 12_000_000_000


def test_startup_adapters_from_sglangs_registry() -> None:
    from types import SimpleNamespace

    from sglang.srt.lora.lora_registry import LoRARef, LoRARegistry

    registry = LoRARegistry(
        [LoRARef(lora_name="sql", lora_path="/a/sql"), LoRARef(lora_name="chat", lora_path="/a/chat")]
    )
    adapters = capabilities.startup_adapters(SimpleNamespace(lora_registry=registry))
    assert [(a.lora_id, a.lora_name, a.source_path) for a in adapters] == [(1, "chat", "/a/chat"), (2, "sql", "/a/sql")]
