"""The SPI's helpers for the chores every driver has: held KV sessions, background tasks, loaded adapters."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from openengine_gateway.errors import NotFound
from openengine_gateway.spi import BackgroundTasks, HeldKvSessions, LoadedAdapters


async def test_a_held_session_is_released_once_with_its_reason() -> None:
    released: list[tuple[str, str]] = []
    sessions: HeldKvSessions[str] = HeldKvSessions()
    sessions.hold("a", "blocks of a", lambda held, reason: released.append((held, reason)))
    sessions.hold("b", "blocks of b", lambda held, reason: released.append((held, reason)))
    assert len(sessions) == 2 and sessions.get("a") == "blocks of a" and sessions.get("x") is None
    assert sessions.release("a", "pulled") and not sessions.release("a")
    assert sessions.release_all() == 1 and sessions.release_all() == 0
    assert released == [("blocks of a", "pulled"), ("blocks of b", "aborted")]


async def test_a_discarded_session_is_not_released_and_an_unreleased_one_expires() -> None:
    released: list[str] = []
    sessions: HeldKvSessions[str] = HeldKvSessions(expire_after_s=0.01)
    sessions.hold("ended", "x", lambda held, reason: released.append(reason))
    sessions.hold("left", "y", lambda held, reason: released.append(reason))
    assert sessions.discard("ended") and not sessions.discard("ended")
    await asyncio.sleep(0.05)
    assert released == ["timeout"] and len(sessions) == 0


async def test_background_tasks_log_failures_and_stop_cancels_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[str] = []
    tasks = BackgroundTasks(lambda what, exc: failures.append(f"{what}: {exc}"))

    async def fail() -> None:
        raise RuntimeError("boom")

    forever = tasks.spawn(asyncio.sleep(3600), "a reader")
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(asyncio.shield(tasks.spawn(fail(), "the failing reader")), 1)
    assert failures == ["the failing reader: boom"] and "the failing reader failed" in caplog.text
    assert len(tasks) == 1
    await tasks.stop()
    assert forever.cancelled() and len(tasks) == 0 and failures == ["the failing reader: boom"]


async def test_stop_ends_a_task_that_swallowed_its_cancellation() -> None:
    """Python 3.11's ``wait_for`` returns a result that arrives with the cancellation, dropping the latter."""
    tasks = BackgroundTasks()

    async def reader() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for does when an entry and the cancel meet
            await asyncio.sleep(3600)
        await asyncio.sleep(3600)  # reads on

    task = tasks.spawn(reader(), "a statistics reader")
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.stop(), 5)
    assert task.done() and len(tasks) == 0


def test_a_request_naming_an_adapter_finds_its_handle_or_not_found() -> None:
    adapters: LoadedAdapters[int] = LoadedAdapters("the test engine")
    adapters.add("a", 7)
    assert adapters.find(None) is None and adapters.find("a") == 7 and len(adapters) == 1
    with pytest.raises(NotFound, match="no LoRA adapter named 'b' is loaded in the test engine"):
        adapters.find("b")
    assert adapters.remove("a") == 7 and adapters.remove("a") is None
