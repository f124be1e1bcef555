"""The gateway over a null engine: what the gateway itself costs, with nothing for an engine to compute.

    python -m benchmarks.null_engine MESSAGES_FILE [--step-s S] [--max-in-flight N]

The whole gateway (``openengine_gateway.testing.serve_backends``: server, interceptor, core, encoder,
event streams) in front of ``NullBackend``, which replays the tokens of a recorded gateway stream: one
token per running request per event-loop turn, as the mock engine's step loop does at zero step time,
but with no pseudo-model, sampler or KV cache behind it. It advertises the mock engine's model, so it
takes the same requests, and its tokens are the recorded ones, so its messages match the bare
server's byte for byte. ``--step-s`` paces the loop (each turn then sleeps that long: a paced engine,
or with an hour, streams held open without a token); ``--max-in-flight`` is the gateway's admission
limit (``[gateway] max_in_flight``). Prints ``null engine gateway listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

import uvloop
from openengine_backends.mock import MockSettings
from openengine_backends.mock.capabilities import model_info
from openengine_gateway import __version__, pb
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    EngineFacts,
    EventStream,
    GenerationRequest,
    OutputFinished,
    TokenDelta,
    TokenRecord,
    UsageReport,
)
from openengine_gateway.testing import serve_backends

from .bare_server import read_messages


class NullBackend(Backend[BackendSettings]):
    """Streams the same recorded tokens to every request, one per loop turn."""

    name = "null"

    def __init__(self, messages: Sequence[pb.GenerateResponse], step_s: float = 0.0) -> None:
        super().__init__(MockSettings())
        self._step_s = step_s
        self._tokens = [
            (TokenRecord(info.token_id, info.token), message.token.text)
            for message in messages
            if message.HasField("token")
            for info in message.token.tokens
        ]
        usage = messages[-1].usage
        self._usage = UsageReport(usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens)
        self._active: dict[str, tuple[EventStream, list[int]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> EngineFacts:
        """Start the step loop; advertise the mock engine's model."""
        self._task = asyncio.create_task(self._run())
        return EngineFacts(engine_name=self.name, engine_version=__version__, model=model_info(MockSettings()))

    async def stop(self) -> None:
        """Stop the step loop."""
        if self._task is not None:
            self._task.cancel()

    def generate(self, request: GenerationRequest) -> EventStream:
        """A stream the step loop feeds from its next turn on."""
        stream = EventStream()
        self._active[request.request_id] = (stream, [0])
        self._wake.set()
        return stream

    async def abort(self, request_id: str) -> None:
        """Drop the request."""
        entry = self._active.pop(request_id, None)
        if entry is not None:
            entry[0].cancel()

    async def _run(self) -> None:
        tokens, last = self._tokens, len(self._tokens) - 1
        while True:
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
            for request_id, (stream, position) in list(self._active.items()):
                record, text = tokens[position[0]]
                stream.put(TokenDelta(0, [record], text))
                if position[0] == last:
                    del self._active[request_id]
                    stream.put(self._usage)
                    stream.put(OutputFinished(0, pb.FINISH_REASON_LENGTH))
                    stream.finish()
                position[0] += 1
            await asyncio.sleep(self._step_s)


async def serve(messages: Sequence[pb.GenerateResponse], step_s: float, max_in_flight: int | None) -> None:
    """Serve the null engine behind the gateway until cancelled."""
    options = GatewayOptions() if max_in_flight is None else GatewayOptions(max_in_flight=max_in_flight)
    async with serve_backends([("mock-model", NullBackend(messages, step_s))], options=options) as running:
        print(f"null engine gateway listening on {running.address}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    """Entry point: ``python -m benchmarks.null_engine MESSAGES_FILE``."""
    parser = argparse.ArgumentParser(description="The gateway over a null engine replaying a recorded stream.")
    parser.add_argument("messages", type=Path)
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds each step-loop turn sleeps (default 0)")
    parser.add_argument("--max-in-flight", type=int, help="the gateway's admission limit (default: the gateway's)")
    args = parser.parse_args()
    uvloop.run(serve(read_messages(args.messages), args.step_s, args.max_in_flight))


if __name__ == "__main__":
    main()
