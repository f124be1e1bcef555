"""SGLang's ZMQ KV-event publishers: where each rank binds, whether the gateway can reach it, what to advertise.

Pure, no SGLang import. Every rule mirrors ``disaggregation/kv_events.py`` ``ZmqEventPublisher`` of
SGLang 0.5.23 (its endpoint per rank, its bind-or-connect decision), so the gateway subscribes exactly
where SGLang publishes; ``tests/backends/sglang/real/`` checks them against the real class.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from openengine_gateway.spi import ConfigurationError, KvEventSource
from openengine_gateway.spi.zmq_kv import zmq_source

from .capabilities import dp_ranks

log = logging.getLogger(__name__)

_DEFAULT_ENDPOINT = "tcp://*:5557"
_BIND_MARKS = ("*", "::", "0.0.0.0")
"""What in an endpoint makes SGLang's publisher bind when ``bind`` is unset: a substring test, so
every IPv6 address spelled with ``::`` binds too (``ZmqEventPublisher._socket_setup``)."""


def kv_events_settings(raw: Any) -> Mapping[str, Any] | None:
    """``--kv-events-config`` (JSON, SGLang's ``KVEventsConfig``) when it asks for a ZMQ publisher."""
    if not raw:
        return None
    config: Mapping[str, Any] = json.loads(raw) if isinstance(raw, str) else raw
    return config if config.get("publisher", "null") == "zmq" else None


def check_kv_events_config(raw: Any) -> None:
    """Before SGLang starts: refuse a publisher the gateway could never subscribe to, and say when
    there will be none to subscribe to.

    SGLang binds an ``inproc://`` endpoint inside its scheduler process: no socket in the
    gateway's process can connect to it, so no KV event would ever arrive. A publisher that
    connects out (to a collector) is legitimate, but leaves the gateway nothing to serve.
    """
    config = kv_events_settings(raw)
    if config is None:
        return
    endpoint = str(config.get("endpoint") or _DEFAULT_ENDPOINT)
    if endpoint.startswith("inproc://"):
        raise ConfigurationError(
            f"sglang: kv_events_config endpoint {endpoint!r} is reachable only inside SGLang's scheduler "
            "process, not from the gateway's: use a tcp:// or ipc:// endpoint"
        )
    if not publisher_binds(config, endpoint):
        log.info(
            "sglang: the KV-event publisher connects out to %s instead of binding it: the gateway has no "
            "KV events to serve or advertise (set bind, or a wildcard host, to subscribe)",
            endpoint,
        )


def publisher_binds(config: Mapping[str, Any], endpoint: str) -> bool:
    """Whether SGLang's publisher binds ``endpoint`` (else it connects out, to a collector)."""
    if config.get("bind") is not None:
        return bool(config["bind"])
    return any(mark in endpoint for mark in _BIND_MARKS) or endpoint.startswith(("ipc://", "inproc://"))


def kv_events_config(server: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """SGLang's ``--kv-events-config`` when its publishers bind a socket this process can reach.

    A publisher that connects out has nothing to subscribe to; an ``inproc://`` one lives in
    SGLang's scheduler process (and is refused before start, ``check_kv_events_config``).
    """
    config = kv_events_settings(server.get("kv_events_config"))
    if config is None:
        return None
    endpoint = str(config.get("endpoint") or _DEFAULT_ENDPOINT)
    if endpoint.startswith("inproc://") or not publisher_binds(config, endpoint):
        return None
    return config


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Rank ``rank``'s endpoint, exactly as SGLang's ``ZmqEventPublisher.offset_endpoint_port``
    derives it: unchanged for rank 0; ``_dp{rank}`` appended to an ``inproc://`` name; the port
    plus ``rank`` for ``tcp://`` (IPv6 hosts included). An ``ipc://`` path has no rank form:
    SGLang fails to start a second rank's publisher there, so only rank 0 ever binds one.
    """
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    raise ValueError(f"SGLang derives no rank-{rank} endpoint from {endpoint!r}")


def kv_event_publishers(server: Mapping[str, Any]) -> dict[int, tuple[str, str]]:
    """``rank -> (endpoint, topic)`` of SGLang's ZMQ KV-event publishers, one per DP rank.

    Under attention DP each attention-DP rank publishes (``select_kv_publisher_dp_rank``), so
    there are ``dp_ranks`` of them, not ``dp_size``.
    """
    config = kv_events_config(server)
    if config is None:
        return {}
    endpoint, topic = str(config.get("endpoint") or _DEFAULT_ENDPOINT), str(config.get("topic") or "")
    return {rank: (rank_endpoint(endpoint, rank), topic) for rank in range(dp_ranks(server))}


def kv_event_sources(server: Mapping[str, Any]) -> list[KvEventSource]:
    """The publishers another host can reach, as ``GetKvEventSources`` entries (``zmq_source``)."""
    config = kv_events_config(server)
    if config is None:
        return []
    replay = config.get("replay_endpoint")
    sources = []
    for rank, (endpoint, topic) in kv_event_publishers(server).items():
        source = zmq_source(
            rank,
            endpoint,
            topic,
            replay_endpoint=rank_endpoint(str(replay), rank) if replay else "",
            buffer_steps=int(config.get("buffer_steps", 10_000)),
            hwm=int(config.get("hwm", 100_000)),
            max_queue_size=int(config.get("max_queue_size", 100_000)),
        )
        if source is not None:
            sources.append(source)
    return sources


__all__ = [
    "check_kv_events_config",
    "kv_event_publishers",
    "kv_event_sources",
    "kv_events_config",
    "kv_events_settings",
    "publisher_binds",
    "rank_endpoint",
]
