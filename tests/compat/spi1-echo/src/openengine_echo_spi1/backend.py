"""``EchoBackend``: the driver, in the shape every driver has.

``generate`` validates synchronously (a ``RequestError`` here is the client's gRPC status,
before acceptance) and returns an async generator of events; the gateway drains it, turns the
events into ``GenerateResponse`` messages and owns every stream invariant. Cancellation and
``Abort`` stop the generator from the gateway's side, so ``abort`` has nothing left to free.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib.metadata import version

from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    EngineFacts,
    GenerationEvent,
    GenerationRequest,
    OutputTracker,
    TokenRecord,
    UsageReport,
    resolve_max_tokens,
)

from .capabilities import PARALLELISM, model_info
from .settings import EchoSettings

EOS = 0
"""The end-of-sequence token; every other token id is a Unicode code point."""
VOCAB_SIZE = 0x110000
"""Token ids run from EOS to the last code point; the gateway does not know it, so the driver checks ids."""


def piece(token: int) -> str:
    """A token's text: its character (EOS has none)."""
    return "" if token == EOS else chr(token)


def tokenize(request: GenerationRequest) -> list[int]:
    """The prompt as token ids; ids that are not characters are the caller's error."""
    if request.prompt is not None:
        ids = [ord(character) for character in request.prompt]
    else:
        ids = list(request.prompt_token_ids or ())
    bad = [t for t in ids if t == EOS or t >= VOCAB_SIZE or 0xD800 <= t <= 0xDFFF]
    if bad:
        raise InvalidArgument(f"token ids {bad[:4]} are not characters: the echo vocabulary is Unicode code points")
    return ids


class EchoBackend(Backend):
    """A deterministic engine that echoes its prompt (see the package docstring)."""

    name = "echo-spi1"
    Settings = EchoSettings

    def __init__(self, settings: BackendSettings) -> None:
        if not isinstance(settings, EchoSettings):
            raise TypeError(f"EchoBackend needs EchoSettings, got {type(settings).__name__}")
        super().__init__(settings)
        self.options = settings
        self._running: set[str] = set()

    async def start(self) -> EngineFacts:
        """Nothing to load: describe the engine."""
        return EngineFacts(
            "echo", version("openengine-echo-spi1-backend"), model_info(self.options), parallelism=PARALLELISM
        )

    async def stop(self) -> None:
        """Nothing to release."""
        self._running.clear()

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Validate now; echo later."""
        prompt = tokenize(request)
        outside = [t for t in request.stopping.stop_token_ids if t >= VOCAB_SIZE]
        if outside:
            raise InvalidArgument(f"stop token id {outside[0]} is outside the vocabulary ({VOCAB_SIZE} tokens)")
        budget = resolve_max_tokens(
            request, len(prompt), self.options.max_context_length, self.options.max_context_length - 1
        )
        return self._echo(request, prompt, budget)

    async def _echo(self, request: GenerationRequest, prompt: list[int], budget: int) -> AsyncIterator[GenerationEvent]:
        stopping = request.stopping
        # Stop tokens, EOS, stop strings, min_tokens and the budget: the SPI's tracker decides what is emitted.
        tracker = OutputTracker(0, stopping, budget=budget, eos_token_ids=(EOS,))
        natural_end = len(prompt) * self.options.repeat
        self._running.add(request.request_id)
        try:
            yield UsageReport(len(prompt), 0)  # known at once: an aborted request still counts its prompt
            while not tracker.done:
                await asyncio.sleep(self.options.token_delay_s)  # also yields the loop between tokens
                position = tracker.generated
                # EOS only once min_tokens allow it: an engine bans it from sampling until tracker.may_stop
                ends = position >= natural_end and tracker.may_stop and not stopping.ignore_eos
                token = EOS if ends else prompt[position % len(prompt)]
                step = tracker.add(token, piece(token), TokenRecord(token, piece(token)))
                yield step.delta
                yield UsageReport(len(prompt), tracker.generated)
                if step.finish is not None:
                    yield step.finish
        finally:
            self._running.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        """The gateway already stopped the generator; nothing else holds engine state."""
        self._running.discard(request_id)

    async def load(self) -> pb.LoadInfo:
        """Requests being echoed; there is no queue."""
        return pb.LoadInfo(running_requests=len(self._running), queued_requests=0)


__all__ = ["EOS", "VOCAB_SIZE", "EchoBackend", "piece", "tokenize"]
