"""vLLM's KV events: its ZMQ publishers (one per data-parallel rank) through the SPI's subscriber,
with skipped batches replayed from vLLM's replay socket when it has one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from openengine_gateway.spi import KvEventBatch, KvEventSource, zmq_kv

from . import capabilities


def subscribable(engine: Any) -> Mapping[int, Any]:
    """vLLM's KV-event publishers this gateway can subscribe to, by data-parallel rank."""
    return capabilities.subscribable(engine.vllm_config, engine.get_kv_event_sources())


def event_sources(engine: Any) -> list[KvEventSource]:
    """The publishers as the SPI's event sources."""
    return capabilities.kv_event_sources(subscribable(engine))


def event_batches(engine: Any) -> AsyncIterator[KvEventBatch]:
    """The published events decoded into batches (vLLM's sequence numbers kept), gaps repaired."""
    sources = subscribable(engine)
    batches = zmq_kv.subscribe({rank: (events.endpoint, events.topic) for rank, events in sources.items()})
    replay = {rank: events.replay_endpoint for rank, events in sources.items() if events.replay_endpoint}
    return zmq_kv.repair_gaps(batches, replay)


__all__ = ["event_batches", "event_sources", "subscribable"]
