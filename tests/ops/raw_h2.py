"""One gRPC call over a raw HTTP/2 connection, for what grpc's own client refuses to send.

grpc's client will not send a metadata value that is not valid ASCII; a hostile or buggy
client can. ``raw_call`` sends exactly the headers it is given (``h2`` with outbound header
validation off) and returns the response headers and trailers as one mapping. ``never_reading``
opens a call whose client grants the server no flow-control window at all: a client that
never reads a byte of its response.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from google.protobuf.message import Message

EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
"""A gRPC frame holding an empty (all-default) protobuf message."""


def frame(message: Message) -> bytes:
    """``message`` as one uncompressed gRPC length-prefixed frame."""
    data = message.SerializeToString()
    return b"\x00" + struct.pack(">I", len(data)) + data


_REQUIRED = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"127.0.0.1")]
_GRPC = [(b"content-type", b"application/grpc"), (b"te", b"trailers")]


def never_reading(port: int, path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> socket.socket:
    """Send one call on a connection whose window for responses is zero, and return its socket:
    the server cannot send a byte of the response until the socket is closed."""
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    connection.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    connection.initiate_connection()
    stream = connection.get_next_available_stream_id()
    connection.send_headers(stream, [*_REQUIRED, (b":path", path.encode()), *_GRPC, *headers])
    connection.send_data(stream, body, end_stream=True)
    sock.sendall(connection.data_to_send())
    return sock


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
        connection.send_headers(stream, [*_REQUIRED, (b":path", path.encode()), *_GRPC, *headers])
        size = connection.max_outbound_frame_size  # a body within the first window (64 KiB), in frames
        for start in range(0, max(len(body), 1), size):
            connection.send_data(stream, body[start : start + size], end_stream=start + size >= len(body))
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


def many_calls(
    port: int, path: str, body: bytes, count: int, headers: Sequence[tuple[bytes, bytes]] = (), settle_s: float = 1.0
) -> tuple[socket.socket, dict[int, bytes]]:
    """Open ``count`` calls with ``body`` on one connection and read for ``settle_s``: the socket (still
    open, so are the calls still running) and each ended call's ``grpc-status`` by stream id."""
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    sock = socket.create_connection(("127.0.0.1", port), timeout=settle_s)
    connection.initiate_connection()
    for _ in range(count):
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, [*_REQUIRED, (b":path", path.encode()), *_GRPC, *headers])
        connection.send_data(stream, body, end_stream=True)
        sock.sendall(connection.data_to_send())
    statuses: dict[int, bytes] = {}
    try:
        while data := sock.recv(65536):
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None:
                        statuses[event.stream_id] = status
                if isinstance(event, h2.events.DataReceived):
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            sock.sendall(connection.data_to_send())
    except TimeoutError:
        pass
    return sock, statuses


def rapid_reset(port: int, path: str, body: bytes, seconds: float, headers: Sequence[tuple[bytes, bytes]] = ()) -> int:
    """CVE-2023-44487's pattern on one connection for ``seconds``: open a call and reset it at once, again
    and again, reading only to answer the server; how many calls it opened before the server ended the
    connection (GOAWAY or close), stopped reading for a second, or the time was up."""
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    opened = 0
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        connection.initiate_connection()
        try:
            while time.monotonic() < deadline:
                for _ in range(100):
                    stream = connection.get_next_available_stream_id()
                    connection.send_headers(stream, [*_REQUIRED, (b":path", path.encode()), *_GRPC, *headers])
                    connection.send_data(stream, body)
                    connection.reset_stream(stream)
                    opened += 1
                sock.sendall(connection.data_to_send())
                while select.select([sock], [], [], 0)[0]:
                    data = sock.recv(65536)
                    if not data:
                        return opened
                    events = connection.receive_data(data)
                    if any(isinstance(event, h2.events.ConnectionTerminated) for event in events):
                        return opened
        except (OSError, h2.exceptions.ProtocolError):
            return opened
    return opened


__all__ = ["EMPTY_MESSAGE", "frame", "many_calls", "never_reading", "rapid_reset", "raw_call"]
