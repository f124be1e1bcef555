"""Shared helpers for the mock backend's tests: start an engine, run a request, read events."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway.spi import (
    GenerationEvent,
    GenerationRequest,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    TokenDelta,
    UsageReport,
)

_ids = itertools.count()


@contextlib.asynccontextmanager
async def engine(**options: Any) -> AsyncIterator[MockBackend]:
    """A started mock backend with ``options`` over the defaults, stopped on exit."""
    backend = MockBackend(MockSettings(**options))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def request(**fields: Any) -> GenerationRequest:
    """A generation request with a fresh id and a default prompt."""
    fields.setdefault("request_id", f"req-{next(_ids)}")
    fields.setdefault("model", "mock")
    if "prompt_token_ids" not in fields:
        fields.setdefault("prompt", "The quick brown fox")
    return GenerationRequest(**fields)


async def run(backend: MockBackend, **fields: Any) -> list[GenerationEvent]:
    """Every event of one request."""
    return [event async for event in backend.generate(request(**fields))]


class Result:
    """One request's events, sorted out per output."""

    def __init__(self, events: list[GenerationEvent]) -> None:
        self.events = events
        self.tokens: dict[int, list[int]] = {}
        self.records: dict[int, list[Any]] = {}
        self.text: dict[int, str] = {}
        self.deltas: dict[int, list[str]] = {}
        self.finished: dict[int, OutputFinished] = {}
        self.usage: UsageReport | None = None
        self.prompt: PromptTokens | None = None
        self.prefill: PrefillDone | None = None
        for event in events:
            if isinstance(event, TokenDelta):
                self.records.setdefault(event.index, []).extend(event.tokens)
                self.tokens.setdefault(event.index, []).extend(t.token_id for t in event.tokens)
                self.text[event.index] = self.text.get(event.index, "") + event.text
                self.deltas.setdefault(event.index, []).append(event.text)
            elif isinstance(event, OutputFinished):
                self.finished[event.index] = event
            elif isinstance(event, UsageReport):
                self.usage = event
            elif isinstance(event, PromptTokens):
                self.prompt = event
            elif isinstance(event, PrefillDone):
                self.prefill = event


async def generate(backend: MockBackend, **fields: Any) -> Result:
    """Run one request and sort out its events."""
    return Result(await run(backend, **fields))
