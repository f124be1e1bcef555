"""A front gateway (``remote``) in front of a back gateway (``mock``), both in process over real gRPC."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openengine_backends.mock import MockBackend, MockSettings
from openengine_backends.remote import RemoteBackend, RemoteSettings
from openengine_gateway.testing import RunningGateway, serve_backends


def remote(target: str, **options: Any) -> RemoteBackend:
    """A remote backend for ``target`` with test-friendly timings over ``options``."""
    options = {"model": "mock", "event_probe_s": 0.2, "resubscribe_delay_s": 0.02, "connect_timeout_s": 5, **options}
    return RemoteBackend(RemoteSettings(target=target, **options))


@contextlib.asynccontextmanager
async def back(**mock: Any) -> AsyncIterator[tuple[RunningGateway, MockBackend]]:
    """A gateway serving a mock engine as ``mock``."""
    engine = MockBackend(MockSettings(**mock))
    async with serve_backends([("mock", engine)]) as running:
        yield running, engine


@contextlib.asynccontextmanager
async def front_and_back(
    *, mock: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[tuple[RunningGateway, RunningGateway, MockBackend]]:
    """A front gateway serving the back's ``mock`` as ``front``; yields (front, back, mock engine)."""
    async with contextlib.AsyncExitStack() as stack:
        behind, engine = await stack.enter_async_context(back(**(mock or {})))
        running = await stack.enter_async_context(serve_backends([("front", remote(behind.address, **options))]))
        yield running, behind, engine


__all__ = ["back", "front_and_back", "remote"]
