"""KV events of engines that publish them over ZMQ, as vLLM's and SGLang's ``ZmqEventPublisher`` do.

A driver of such an engine needs three things, all here: ``subscribe`` (one SUB socket over every
rank's publisher, yielding decoded ``spi.KvEventBatch`` values), ``repair_gaps`` (batches a SUB
socket dropped, fetched from the publisher's replay socket), and ``zmq_source`` (a publisher as
the ``KvEventSource`` that ``Backend.kv_event_sources`` lists)::

    def kv_events(self) -> AsyncIterator[spi.KvEventBatch]:
        return zmq_kv.repair_gaps(zmq_kv.subscribe({0: ("tcp://127.0.0.1:5557", "")}), {0: "tcp://127.0.0.1:5558"})

Importing this package imports pyzmq and msgpack; ``openengine_gateway.spi`` itself does not.
"""

from .events import connect_address, decode_batch, decode_event, subscribe
from .replay import END_SEQUENCE, fetch_replay, repair_gaps
from .sources import zmq_host_port, zmq_source

__all__ = [
    "END_SEQUENCE",
    "connect_address",
    "decode_batch",
    "decode_event",
    "fetch_replay",
    "repair_gaps",
    "subscribe",
    "zmq_host_port",
    "zmq_source",
]
