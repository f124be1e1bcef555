"""SGLang's KV-event publishers: per-rank endpoints, bind or connect, what GetKvEventSources advertises."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from openengine_backends.sglang import kv_publishers
from openengine_gateway import pb
from openengine_gateway.contract.kv_wire import kv_source_to_proto
from openengine_gateway.errors import ConfigurationError

from .test_capabilities import server


def advertised(args: dict[str, Any]) -> list[pb.KvEventSource]:
    """The driver's publishers as ``GetKvEventSources`` sends them."""
    return [kv_source_to_proto(source) for source in kv_publishers.kv_event_sources(args)]


def test_kv_event_sources_per_dp_rank() -> None:
    config = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}
    args = server(kv_events_config=json.dumps(config), dp_size=2)
    assert kv_publishers.kv_event_publishers(args) == {0: ("tcp://*:5557", "kv"), 1: ("tcp://*:5558", "kv")}
    first, second = advertised(args)
    assert first.endpoint_addr == pb.KvEndpoint(host="*", port=5557, protocol="tcp")
    assert (second.data_parallel_rank, second.replay_endpoint) == (1, "tcp://*:5601")
    assert (first.encoding, first.hwm, first.buffer_steps, first.topic) == ("msgpack", 100_000, 10_000, "kv")
    connecting = server(kv_events_config=json.dumps({"publisher": "zmq", "endpoint": "tcp://collector:5557"}))
    assert advertised(connecting) == [], "a publisher that connects out has nothing to subscribe"
    assert kv_publishers.kv_event_publishers(server()) == {}


@pytest.mark.parametrize(
    ("endpoint", "bind", "expected"),
    [
        ("ipc:///run/kv.sock", None, {0: "ipc:///run/kv.sock"}),
        ("tcp://[::]:5557", None, {0: "tcp://[::]:5557", 1: "tcp://[::]:5558"}),
        ("tcp://[::1]:5557", None, {0: "tcp://[::1]:5557", 1: "tcp://[::1]:5558"}),
        ("tcp://[fd00:0:0:0:0:0:0:1]:5557", None, {}),
        (
            "tcp://[fd00:0:0:0:0:0:0:1]:5557",
            True,
            {0: "tcp://[fd00:0:0:0:0:0:0:1]:5557", 1: "tcp://[fd00:0:0:0:0:0:0:1]:5558"},
        ),
        ("tcp://127.0.0.1:5557", True, {0: "tcp://127.0.0.1:5557", 1: "tcp://127.0.0.1:5558"}),
        ("tcp://127.0.0.1:5557", None, {}),
        ("tcp://*:5557", False, {}),
    ],
)
def test_publishers_are_found_where_sglang_binds_them(
    endpoint: str, bind: bool | None, expected: dict[int, str]
) -> None:
    """SGLang's ``_socket_setup`` binds when ``bind`` says so, else for ``*``, ``::`` or ``0.0.0.0``
    anywhere in the endpoint (every IPv6 address written with ``::``), ``ipc://`` and ``inproc://``;
    ``offset_endpoint_port`` gives rank ``r`` the port plus ``r``. One ipc path serves one rank only."""
    config: dict[str, Any] = {"publisher": "zmq", "endpoint": endpoint}
    if bind is not None:
        config["bind"] = bind
    ranks = 1 if endpoint.startswith("ipc://") else 2
    args = server(kv_events_config=json.dumps(config), dp_size=ranks)
    assert {rank: found for rank, (found, _) in kv_publishers.kv_event_publishers(args).items()} == expected


def test_sources_name_a_bracketless_ipv6_host_and_skip_ipc() -> None:
    ipv6 = server(kv_events_config=json.dumps({"publisher": "zmq", "endpoint": "tcp://[::1]:5557"}))
    assert advertised(ipv6)[0].endpoint_addr == pb.KvEndpoint(host="::1", port=5557, protocol="tcp")
    ipc = server(kv_events_config=json.dumps({"publisher": "zmq", "endpoint": "ipc:///run/kv.sock"}))
    assert advertised(ipc) == [], "an ipc socket has no host:port to advertise"


def test_rank_endpoints_as_sglang_offsets_them() -> None:
    assert kv_publishers.rank_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    assert kv_publishers.rank_endpoint("ipc:///run/kv.sock", 0) == "ipc:///run/kv.sock"
    with pytest.raises(ValueError, match="no rank-1 endpoint"):
        kv_publishers.rank_endpoint("ipc:///run/kv.sock", 1)


def test_an_inproc_publisher_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="inproc://cache"):
        kv_publishers.check_kv_events_config(json.dumps({"publisher": "zmq", "endpoint": "inproc://cache"}))
    kv_publishers.check_kv_events_config(json.dumps({"publisher": "null", "endpoint": "inproc://cache"}))
    kv_publishers.check_kv_events_config(None)


def test_a_publisher_that_connects_out_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=kv_publishers.__name__):
        kv_publishers.check_kv_events_config({"publisher": "zmq", "endpoint": "tcp://collector:5557"})
        kv_publishers.check_kv_events_config({"publisher": "zmq", "endpoint": "tcp://*:5557"})
    (record,) = caplog.records
    assert "connects out to tcp://collector:5557" in record.getMessage()
