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
    OutputFinished,
    StopMatch,
    StopTextHit,
    StopTextMatcher,
    TokenDelta,
    TokenRecord,
    UsageReport,
    resolve_max_tokens,
    stop_match_for_token,
)

from .capabilities import PARALLELISM, model_info
from .settings import EchoSettings

EOS = 0
"""The end-of-sequence token; every other token id is a Unicode code point."""


def piece(token: int) -> str:
    """A token's text: its character (EOS has none)."""
    return "" if token == EOS else chr(token)


def tokenize(request: GenerationRequest) -> list[int]:
    """The prompt as token ids; ids that are not characters are the caller's error."""
    if request.prompt is not None:
        ids = [ord(character) for character in request.prompt]
    else:
        ids = list(request.prompt_token_ids or ())
    bad = [t for t in ids if t == EOS or t > 0x10FFFF or 0xD800 <= t <= 0xDFFF]
    if bad:
        raise InvalidArgument(f"token ids {bad[:4]} are not characters: the echo vocabulary is Unicode code points")
    return ids


class EchoBackend(Backend):
    """A deterministic engine that echoes its prompt (see the package docstring)."""

    name = "echo"
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
            "echo", version("openengine-echo-backend"), model_info(self.options), parallelism=PARALLELISM
        )

    async def stop(self) -> None:
        """Nothing to release."""
        self._running.clear()

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Validate now; echo later."""
        prompt = tokenize(request)
        budget = resolve_max_tokens(
            request, len(prompt), self.options.max_context_length, self.options.max_context_length - 1
        )
        return self._echo(request, prompt, budget)

    async def _echo(self, request: GenerationRequest, prompt: list[int], budget: int) -> AsyncIterator[GenerationEvent]:
        stopping = request.stopping
        matcher = StopTextMatcher(stopping.stop_texts, include_stop=stopping.include_stop_in_output)
        natural_end = len(prompt) * self.options.repeat
        self._running.add(request.request_id)
        try:
            yield UsageReport(len(prompt), 0)  # known at once: an aborted request still counts its prompt
            for position in range(budget):
                await asyncio.sleep(self.options.token_delay_s)  # also yields the loop between tokens
                past_min = position >= stopping.min_tokens  # before min_tokens, nothing may end the output
                ends = position >= natural_end and past_min and not stopping.ignore_eos
                token = EOS if ends else prompt[position % len(prompt)]
                record = TokenRecord(token, piece(token))
                stop = stop_match_for_token(token, stopping, (EOS,)) if past_min else None
                if stop is not None:  # EOS stays in the records without text; a caller's stop token only if kept
                    keep = stop.stop_token_id is None or stopping.include_stop_in_output
                    yield TokenDelta(0, [record] if keep else [], matcher.flush() + (piece(token) if keep else ""))
                else:
                    fed = matcher.feed(piece(token), armed=past_min)
                    hit = fed if isinstance(fed, StopTextHit) else None
                    stop = StopMatch.text(hit.stop) if hit is not None else None
                    yield TokenDelta(0, [record], hit.text if hit is not None else fed)
                yield UsageReport(len(prompt), position + 1)
                if stop is not None:
                    yield OutputFinished(0, pb.FINISH_REASON_STOP, stop)
                    return
            yield TokenDelta(0, [], matcher.flush())
            yield OutputFinished(0, pb.FINISH_REASON_LENGTH)
        finally:
            self._running.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        """The gateway already stopped the generator; nothing else holds engine state."""
        self._running.discard(request_id)

    async def load(self) -> pb.LoadInfo:
        """Requests being echoed; there is no queue."""
        return pb.LoadInfo(running_requests=len(self._running), queued_requests=0)


__all__ = ["EOS", "EchoBackend", "piece", "tokenize"]
