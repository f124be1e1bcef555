"""The ceiling: a bare grpc.aio server whose only method, Generate, streams pre-built messages.

    python -m benchmarks.bare_server MESSAGES_FILE [--hold]

``MESSAGES_FILE`` holds one recorded gateway stream with one token per message (``write_messages``).
A call's ``x-bench-chunks: N`` metadata asks for that stream's tokens in N messages, merged the way
the gateway coalesces tokens for a lagging client (``coalesce``), so the bare server can send what the
gateway sent under the same load, byte for byte; without it the recorded stream is sent as it is. The
messages are built once and reused, so the only per-message work left is gRPC's own: what no gateway
can go below. ``--hold`` keeps each call open without sending anything (to measure the memory of
open streams). It runs on uvloop with the gateway's channel options, and prints
``bare server listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import struct
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import uvloop
from openengine_gateway import pb

_LENGTH = struct.Struct("<I")
CHUNKS_KEY = "x-bench-chunks"
"""Call metadata: how many token messages to send the recorded tokens in."""


def write_messages(path: Path, messages: Sequence[pb.GenerateResponse]) -> None:
    """Save a stream as length-prefixed serialized messages."""
    with path.open("wb") as f:
        for message in messages:
            data = message.SerializeToString()
            f.write(_LENGTH.pack(len(data)) + data)


def read_messages(path: Path) -> list[pb.GenerateResponse]:
    """The messages ``write_messages`` saved."""
    data = path.read_bytes()
    messages, offset = [], 0
    while offset < len(data):
        (size,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        messages.append(pb.GenerateResponse.FromString(data[offset : offset + size]))
        offset += size
    return messages


def coalesce(messages: Sequence[pb.GenerateResponse], chunks: int) -> list[pb.GenerateResponse]:
    """The stream with its token messages merged into ``chunks`` messages of near-equal size.

    Merging appends tokens and text to the first message of each group, exactly what the gateway's
    event stream does to the deltas a slow client has not read yet.
    """
    tokens = [message for message in messages if message.HasField("token")]
    others = [message for message in messages if not message.HasField("token")]
    chunks = max(1, min(chunks, len(tokens)))
    bounds = [round(i * len(tokens) / chunks) for i in range(chunks + 1)]
    merged = []
    for start, end in itertools.pairwise(bounds):
        message = pb.GenerateResponse()
        message.CopyFrom(tokens[start])
        for later in tokens[start + 1 : end]:
            message.token.tokens.extend(later.token.tokens)
            message.token.text += later.token.text
        merged.append(message)
    return merged + others


class BareGenerate:
    """Generate, and nothing else: a generic handler for the one method (others are UNIMPLEMENTED)."""

    def __init__(self, messages: Sequence[pb.GenerateResponse], *, hold: bool) -> None:
        self._messages = tuple(messages)
        self._hold = hold

    @functools.cache  # noqa: B019 - one instance per process; a few hundred small lists at most
    def _stream(self, chunks: int) -> tuple[pb.GenerateResponse, ...]:
        return tuple(coalesce(self._messages, chunks))

    async def generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        """The recorded stream, merged into the chunks the call asked for."""
        if self._hold:
            await asyncio.Event().wait()
        chunks = next((value for key, value in context.invocation_metadata() or () if key == CHUNKS_KEY), None)
        for message in self._stream(int(chunks)) if chunks is not None else self._messages:
            yield message

    def handler(self) -> grpc.GenericRpcHandler:
        """The service with its one method, ready for ``add_generic_rpc_handlers``."""
        method = grpc.unary_stream_rpc_method_handler(
            self.generate,
            request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=pb.GenerateResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(pb.SERVICE_NAME, {"Generate": method})


async def serve(messages: Sequence[pb.GenerateResponse], *, hold: bool) -> None:
    """Serve on a free loopback port until cancelled."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
    )
    server.add_generic_rpc_handlers((BareGenerate(messages, hold=hold).handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"bare server listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    """Entry point: ``python -m benchmarks.bare_server MESSAGES_FILE [--hold]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("messages", type=Path)
    parser.add_argument("--hold", action="store_true", help="keep every call open without sending")
    args = parser.parse_args()
    uvloop.run(serve(read_messages(args.messages), hold=args.hold))


if __name__ == "__main__":
    main()
