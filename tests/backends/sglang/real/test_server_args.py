"""``server_args.server_kwargs`` → SGLang's real ``ServerArgs``, resolved on this CPU, read by the driver.

``Engine(**kwargs)`` builds ``ServerArgs(**kwargs)`` and resolves it (``resolve_once``, the
``arg_groups`` pipeline); the scheduler reports the resolved record (``resolved_server_args_dict``)
as the start of ``get_internal_state``, which is what ``capabilities`` reads. Here the same record
is resolved for the tiny Llama and handed to the driver's readers.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, kv_publishers
from openengine_backends.sglang.server_args import server_kwargs
from openengine_gateway.errors import ConfigurationError

DRIVER = Path(capabilities.__file__).parent


def resolved(model: Path, **options: Any) -> tuple[Any, dict[str, Any]]:
    """SGLang's resolved ``ServerArgs`` for the driver's options, and the dict the scheduler reports."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**server_kwargs(str(model), {"device": "cpu", **options}))
    args.resolve_once()
    return args, args.resolved_dict()


def state(server: dict[str, Any], **facts: Any) -> capabilities.EngineState:
    return capabilities.EngineState(server=server, context_len=256, max_req_input_len=250, vocab_size=512, **facts)


def test_dp_attention_resolves_to_attention_ranks_and_one_replica(tiny_model: Path) -> None:
    """``--dp-size 2 --enable-dp-attention`` (``arg_groups/parallel_hook.py handle_deprecated_dp_attention``)."""
    _, server = resolved(tiny_model, dp_size="2", enable_dp_attention="true", tp_size="2")
    assert (server["dp_size"], server["attn_dp_size"]) == (1, 2)
    assert capabilities.dp_size(server) == 1, "runtime LoRA loading asserts SGLang's dp_size, which is 1"
    assert capabilities.dp_ranks(server) == 2
    assert capabilities.parallelism(server).data_parallel_size == 2
    limits = capabilities.engine_limits(state(server))
    assert (limits.dp_size, limits.dp_ranks) == (1, 2)


def test_attention_dp_by_its_own_flag(tiny_model: Path) -> None:
    _, server = resolved(tiny_model, attn_dp_size="2", tp_size="2")
    assert (server["dp_size"], server["attn_dp_size"]) == (1, 2)
    assert capabilities.dp_ranks(server) == 2


def test_replicas_of_attention_dp_groups_are_refused_by_sglang(tiny_model: Path) -> None:
    """So the ranks are replicas or attention-DP groups, never both, and ``dp_ranks`` is one
    KV publisher per rank (``select_kv_publisher_dp_rank``)."""
    with pytest.raises(ValueError, match="not supported"):
        resolved(tiny_model, dp_size="2", attn_dp_size="2", tp_size="4")


def test_plain_data_parallelism_is_replicas(tiny_model: Path) -> None:
    _, server = resolved(tiny_model, dp_size="2")
    assert (server["dp_size"], server["attn_dp_size"]) == (2, 1)
    assert capabilities.dp_ranks(server) == 2


def test_page_size(tiny_model: Path) -> None:
    _, server = resolved(tiny_model, page_size="16")
    assert server["page_size"] == 16
    assert capabilities.model_info(state(server)).kv_block_size == 16


def test_the_default_page_size_on_this_platform(tiny_model: Path) -> None:
    _, server = resolved(tiny_model)
    assert capabilities.model_info(state(server)).kv_block_size == server["page_size"] >= 1


def test_decode_context_parallelism_widens_the_event_block(tiny_model: Path) -> None:
    """``kv_event_block_size_of`` (``arg_groups/overrides.py``): ``page_size * dcp_size``."""
    from sglang.srt.arg_groups.overrides import kv_event_block_size_of, resolving_view

    args, server = resolved(tiny_model, dcp_size=2, page_size=16, tp_size=2)
    assert server["page_size"] == 16
    assert capabilities.model_info(state(server)).kv_block_size == kv_event_block_size_of(resolving_view(args)) == 32


def test_context_length_is_the_model_configs(tiny_model: Path) -> None:
    from sglang.srt.configs.model_config import ModelConfig

    args, server = resolved(tiny_model, context_length="512")
    assert server["context_length"] == 512
    assert ModelConfig.from_server_args(args).context_len == 512
    args, _ = resolved(tiny_model)
    assert ModelConfig.from_server_args(args).context_len == 1024, "the model's own max_position_embeddings"


def test_unset_grammar_backend_resolves_to_xgrammar(tiny_model: Path) -> None:
    _, server = resolved(tiny_model)
    assert capabilities.grammar_backend(server) == server["grammar_backend"] == "xgrammar"
    _, server = resolved(tiny_model, grammar_backend="none")
    assert capabilities.grammar_backend(server) is None


def test_an_aggregated_engine_is_neither_prefill_nor_decode(tiny_model: Path) -> None:
    _, server = resolved(tiny_model)
    assert server["disaggregation_mode"] == "null"
    assert capabilities.kv_connector(server, "h") is None
    assert capabilities.transfer_backend(server) == ""


def test_scheduling_flags(tiny_model: Path) -> None:
    """(``--enable-deterministic-inference`` does not resolve here: it wants a GPU attention backend.)"""
    _, server = resolved(tiny_model, enable_priority_scheduling="true", schedule_low_priority_values_first="true")
    limits = capabilities.engine_limits(state(server))
    assert limits.priority_scheduling and limits.low_priority_values_first and not limits.deterministic


def test_every_server_field_the_driver_reads_is_one_sglang_reports() -> None:
    """A misspelt key would read as unset forever: each one is a resolved ``ServerArgs`` field
    or one the scheduler adds to its internal state (``scheduler_components/internal_state.py``)."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.server_args import ServerArgs

    read = set()
    for source in DRIVER.glob("*.py"):
        read |= set(re.findall(r"server(?:\.get\(|\[)\"(\w+)\"", source.read_text()))
    fields = {field.name for field in record_fields(ServerArgs)}
    added = set(re.findall(r"state\[\"(\w+)\"\]", inspect.getsource(SchedulerInternalStateController)))
    assert read, "the driver reads the server state"
    assert read - fields - added == set()


def test_string_options_go_through_sglangs_own_parser(tiny_model: Path) -> None:
    from sglang.srt.server_args import ServerArgs

    kwargs = server_kwargs(
        str(tiny_model),
        {"context_length": "512", "enable_lora": "true", "max_running_requests": 8, "mem_fraction_static": "0.5"},
    )
    assert kwargs["context_length"] == 512 and kwargs["mem_fraction_static"] == 0.5
    assert kwargs["enable_lora"] is True and kwargs["max_running_requests"] == 8
    args = ServerArgs(**kwargs)
    assert (args.context_length, args.enable_lora, args.model_path) == (512, True, str(tiny_model))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"no_such_option": "1"}, "unknown server arguments: no_such_option"),
        ({"context_length": "long"}, "invalid server argument"),
        ({"enable_lora": "maybe"}, "takes true or false"),
        ({"grammar_backend": "regexp"}, "invalid server argument"),
    ],
)
def test_options_sglang_would_refuse(tiny_model: Path, options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        server_kwargs(str(tiny_model), options)


def test_kv_event_publishers_follow_the_resolved_ranks(tiny_model: Path) -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"})
    _, server = resolved(tiny_model, dp_size="2", enable_dp_attention="true", tp_size="2", kv_events_config=config)
    assert kv_publishers.kv_event_publishers(server) == {0: ("tcp://*:5557", "kv"), 1: ("tcp://*:5558", "kv")}


def test_a_table_means_its_json_text_on_sglangs_command_line(tiny_model: Path) -> None:
    """A ``plugins.toml`` table for an argument SGLang reads as JSON text reaches SGLang as that text:
    as a dict it passed ``ServerArgs`` and failed in the scheduler (``KVEventsConfig.from_cli``)."""
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    table = {"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}
    args, server = resolved(tiny_model, kv_events_config=table, preferred_sampling_params={"temperature": 0.5})
    assert KVEventsConfig.from_cli(args.kv_events_config) == KVEventsConfig(**table)
    assert kv_publishers.kv_event_publishers(server) == {0: ("tcp://*:5557", "kv")}
    assert args.preferred_sampling_params == {"temperature": 0.5}, "its command line reads JSON into a dict"
