"""``server.app.reserved``: the ports are held before any engine starts, and handed to the server."""

from __future__ import annotations

import socket

import grpc
import pytest
from openengine_gateway.server.app import ServerOptions, reserved


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_in_use_is_refused_naming_the_address() -> None:
    with listening() as other:
        port = other.getsockname()[1]
        expected = f"cannot listen on 127.0.0.1:{port}: Address already in use"
        with pytest.raises(OSError, match=expected), reserved(ServerOptions(port=port)):
            pass


def test_a_metrics_port_in_use_is_refused_too() -> None:
    with listening() as other:
        port = other.getsockname()[1]
        expected = f"cannot serve metrics on 127.0.0.1:{port}"
        with pytest.raises(OSError, match=expected), reserved(ServerOptions(port=0, metrics_port=port)):
            pass


async def test_the_held_port_is_resolved_kept_from_others_and_taken_by_the_server() -> None:
    with reserved(ServerOptions(port=0, metrics_port=0)) as options:
        assert options.port != 0 and options.metrics_port not in (0, None)
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", options.port))
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        assert server.add_insecure_port(f"127.0.0.1:{options.port}") == options.port
    await server.start()
    await server.stop(0)
