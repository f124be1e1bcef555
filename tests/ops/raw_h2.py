"""One gRPC call over a raw HTTP/2 connection, for what grpc's own client refuses to send.

grpc's client will not send a metadata value that is not valid ASCII; a hostile or buggy
client can. ``raw_call`` sends exactly the headers it is given (``h2`` with outbound header
validation off) and returns the response headers and trailers as one mapping.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events

EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
"""A gRPC frame holding an empty (all-default) protobuf message."""


def raw_call(
    port: int, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes = EMPTY_MESSAGE, timeout_s: float = 5.0
) -> dict[bytes, bytes]:
    """POST ``body`` to ``path`` on 127.0.0.1:``port`` with ``headers``; the response's headers and trailers."""
    config = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False)
    connection = h2.connection.H2Connection(config)
    received: dict[bytes, bytes] = {}
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        required = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        connection.send_headers(stream, [*required, *headers])
        connection.send_data(stream, body, end_stream=True)
        sock.sendall(connection.data_to_send())
        ended = False
        while not ended:
            data = sock.recv(65536)
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    received.update((bytes(k), bytes(v)) for k, v in event.headers)
                ended = ended or isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)
            sock.sendall(connection.data_to_send())
    return received


__all__ = ["EMPTY_MESSAGE", "raw_call"]
