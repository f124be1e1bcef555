"""A driver's mistakes at request time, told apart from the gateway's own bugs.

A plugin that returns the wrong type, breaks the event protocol or lets an exception escape is a
broken engine, not a broken gateway: the request ends with a retryable error that names the plugin
(an ``EngineError`` after acceptance, UNAVAILABLE on a unary call), the engine's count goes up
(``openengine_gateway_driver_faults_total``), and Health reports the engine NOT_READY with the
message for ``FAULT_HOLD_S``. An exception of the gateway's own code stays INTERNAL.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from .. import pb
from ..errors import EngineFailure, RequestError, Unavailable
from ..spi.backend import Backend
from ..spi.events import EventStream
from ..spi.requests import GenerationRequest

log = logging.getLogger(__name__)

FAULT_HOLD_S = 60.0
"""How long Health reports the engine NOT_READY after its driver's latest mistake."""
RETRY_AFTER_MS = 1000
"""The delay suggested to a client whose request met a driver mistake (another engine may serve it)."""


class DriverFaults:
    """One engine's driver mistakes: how many, and the latest one while it is recent."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.count = 0
        self._latest: tuple[str, float] | None = None

    def record(self, what: str, exc: BaseException | None = None) -> str:
        """Count and log one mistake (with the traceback of ``exc``, what escaped the driver); the message
        that names the plugin."""
        message = f"backend {self.backend!r} broke the backend SPI: {what}"
        self.count += 1
        self._latest = (message, time.monotonic())
        log.error("%s", message, exc_info=exc)
        return message

    def failure(self, what: str, exc: BaseException | None = None) -> EngineFailure:
        """The terminal, retryable ``EngineError`` of an accepted request the driver failed."""
        message = self.record(what, exc)
        return EngineFailure(pb.ERROR_CODE_INTERNAL, message, retryable=True, retry_after_ms=RETRY_AFTER_MS)

    def unavailable(self, what: str, exc: BaseException | None = None) -> Unavailable:
        """The retryable status of a unary call the driver failed."""
        return Unavailable(self.record(what, exc), retry_after_ms=RETRY_AFTER_MS)

    @property
    def latest(self) -> str | None:
        """The latest mistake's message, within ``FAULT_HOLD_S`` of it; else None."""
        if self._latest is None or time.monotonic() - self._latest[1] > FAULT_HOLD_S:
            return None
        return self._latest[0]


T = TypeVar("T")


async def awaited(faults: DriverFaults, method: str, work: Awaitable[T], expected: type[T] | None = None) -> T:
    """The driver's ``method`` call awaited: a refusal or failure of its own is raised as it is; anything else that
    escapes it, or a result that is not ``expected``, is its mistake (UNAVAILABLE naming it)."""
    try:
        result = await work
    except (RequestError, EngineFailure):
        raise
    except Exception as exc:  # broad on purpose: whatever escapes the driver is the driver's mistake
        raise faults.unavailable(f"{method} raised {escaped(exc)}", exc) from None
    if expected is not None and not isinstance(result, expected):
        raise faults.unavailable(f"{method} returned {kind(result)}, not an spi.{expected.__name__}")
    return result


def listed(faults: DriverFaults, method: str, call: Callable[[], Any], expected: type[T]) -> list[T]:
    """The driver's synchronous ``method`` that returns a list of ``expected`` values; its mistake is UNAVAILABLE."""
    try:
        values = list(call())
    except (RequestError, EngineFailure):
        raise
    except Exception as exc:  # broad on purpose: whatever escapes the driver is the driver's mistake
        raise faults.unavailable(f"{method} raised {escaped(exc)}", exc) from None
    wrong = next((value for value in values if not isinstance(value, expected)), None)
    if wrong is not None:
        raise faults.unavailable(f"{method} returned a {kind(wrong)}, not an spi.{expected.__name__}")
    return values


def kind(value: object) -> str:
    """What a driver returned, as a message names it: ``pb.LoadInfo`` for a wire message, else its type's name."""
    return f"pb.{type(value).__name__}" if isinstance(value, Message) else type(value).__name__


def escaped(exc: BaseException) -> str:
    """How an exception that escaped the driver is named in the message."""
    return f"{type(exc).__name__}: {exc}"


def open_stream(backend: Backend[Any], faults: DriverFaults, request: GenerationRequest) -> EventStream:
    """``backend.generate(request)``; a driver mistake is a stream that fails with it, so the request,
    already accepted, ends with one ``EngineError``. A refusal (``RequestError``) is raised as it is."""
    try:
        events = backend.generate(request)
    except (RequestError, EngineFailure):
        raise
    except Exception as exc:  # broad on purpose: whatever escapes the driver is the driver's mistake
        return _failed(faults.failure(f"generate raised {escaped(exc)}", exc))
    if isinstance(events, EventStream):
        return events
    if inspect.iscoroutine(events):
        events.close()  # never awaited: no warning
    return _failed(faults.failure(f"generate returned {kind(events)}, not an EventStream"))


def _failed(failure: EngineFailure) -> EventStream:
    stream = EventStream()
    stream.fail(failure)
    return stream


__all__ = ["FAULT_HOLD_S", "RETRY_AFTER_MS", "DriverFaults", "awaited", "escaped", "kind", "listed", "open_stream"]
