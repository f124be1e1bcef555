"""A ZMQ publisher as a ``KvEventSource``: what ``GetKvEventSources`` advertises for it."""

from __future__ import annotations

from ..kv_events import KvEventSource
from ..requests import Endpoint


def zmq_host_port(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` → (host, port); a ``*`` host stays a wildcard, IPv6 brackets go."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"not a tcp endpoint: {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host.strip("[]"), int(port)


def zmq_source(
    rank: int,
    endpoint: str,
    topic: str,
    *,
    replay_endpoint: str = "",
    buffer_steps: int | None = None,
    hwm: int | None = None,
    max_queue_size: int | None = None,
) -> KvEventSource | None:
    """Rank ``rank``'s msgpack publisher at ``endpoint``, or None for one another host cannot reach
    (an ``ipc://`` socket has no host and port: its events reach clients through ``SubscribeKvEvents``
    only). A wildcard bind host stays one; the gateway advertises its routable host instead."""
    if not endpoint.startswith("tcp://"):
        return None
    host, port = zmq_host_port(endpoint)
    return KvEventSource(
        transport="zmq",
        endpoint=Endpoint(host=host, port=port, protocol="tcp"),
        topic=topic,
        replay_endpoint=replay_endpoint,
        data_parallel_rank=rank,
        encoding="msgpack",
        buffer_steps=buffer_steps,
        hwm=hwm,
        max_queue_size=max_queue_size,
    )


__all__ = ["zmq_host_port", "zmq_source"]
