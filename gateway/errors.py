"""The gateway's errors: one small hierarchy, two phases.

The contract gives every failure exactly one transport, chosen by when it happens:

* ``RequestError`` and its subclasses happen *before acceptance*. Each carries the gRPC
  status it becomes; the transport edge (``server.servicer``) is the only place that turns
  it into a non-OK status. Pure contract code never imports grpc, so statuses are named
  here by ``Status``.
* ``EngineFailure`` happens *after acceptance*. The stream encoder turns it into exactly one
  terminal ``EngineError`` event, and the RPC still ends with status OK.

Drivers raise the same classes: a ``RequestError`` from a driver's synchronous validation is
a pre-acceptance rejection; an ``EngineFailure`` (or any other exception, reported as
``ERROR_CODE_INTERNAL``) from a running stream is an application failure.

``SetupError`` and its subclasses happen before serving, while the gateway starts: each carries
the exit status the ``openengine-gateway`` command ends with. A driver reports a setting the user
must fix with ``ConfigurationError`` (exit 2).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from . import pb


class Status(enum.Enum):
    """gRPC status codes by name; ``grpc.StatusCode[status.name]`` at the transport edge."""

    CANCELLED = "CANCELLED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"


ECHO_CHARS = 64
"""How much of a client's string a message repeats (``clip``)."""
MAX_STATUS_MESSAGE_BYTES = 1000
"""The longest status message sent: under 1 KiB, far below a client's 16 KiB metadata limit."""


def clip(value: str, keep: int = ECHO_CHARS) -> str:
    """A client's string as a message repeats it: quoted whole when short, else its first ``keep``
    characters and its length, so no message grows with what a client sends."""
    if len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}... ({len(value)} characters)"


class _EnumDescriptor(Protocol):
    """What ``enum_name`` reads of a protobuf enum's descriptor (``pb.FinishReason.DESCRIPTOR``)."""

    @property
    def values_by_number(self) -> Mapping[int, Any]: ...


def enum_name(enum: _EnumDescriptor, value: int) -> str:
    """An enum value as a message names it: its name (``TASK_OUTPUT_GRANULARITY_TOKEN``), or its
    number when the enum has no such value."""
    known = enum.values_by_number.get(value)
    return known.name if known is not None else str(value)


def bounded_message(message: str) -> str:
    """``message`` cut to ``MAX_STATUS_MESSAGE_BYTES`` of UTF-8, marked where it was cut."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    return data[: MAX_STATUS_MESSAGE_BYTES - 20].decode("utf-8", "ignore") + " ... (cut)"


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class RequestError(GatewayError):
    """A request rejected before acceptance; becomes a non-OK gRPC status.

    ``retry_after_ms`` is a hint for retryable rejections (overload, draining); the transport
    sends it as the ``retry-after-ms`` trailing metadata entry.
    """

    status: ClassVar[Status] = Status.INTERNAL

    def __init__(self, message: str, *, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms


class InvalidArgument(RequestError):
    """Malformed input, or an explicit option the target does not advertise."""

    status = Status.INVALID_ARGUMENT


class NotFound(RequestError):
    """An unknown model, request id, KV session or LoRA adapter."""

    status = Status.NOT_FOUND


class AlreadyExists(RequestError):
    """A duplicate in-flight request id or a conflicting LoRA adapter."""

    status = Status.ALREADY_EXISTS


class FailedPrecondition(RequestError):
    """The target cannot serve this kind of request (unsupported task, role mismatch, LoRA off)."""

    status = Status.FAILED_PRECONDITION


class OutOfRange(RequestError):
    """A position outside what the server retains (a KV-event replay start that was evicted)."""

    status = Status.OUT_OF_RANGE


class ResourceExhausted(RequestError):
    """Admission or capacity exhausted; retryable after ``retry_after_ms``."""

    status = Status.RESOURCE_EXHAUSTED


class Unavailable(RequestError):
    """The gateway is draining or the engine is down; retryable elsewhere or later."""

    status = Status.UNAVAILABLE


class Unimplemented(RequestError):
    """The engine behind the target does not implement this RPC at all."""

    status = Status.UNIMPLEMENTED


class Unauthenticated(RequestError):
    """A missing or wrong bearer token."""

    status = Status.UNAUTHENTICATED


class PermissionDenied(RequestError):
    """A valid token without the scope this RPC needs."""

    status = Status.PERMISSION_DENIED


class Cancelled(RequestError):
    """A unary task request stopped by ``Abort`` before it completed."""

    status = Status.CANCELLED


class Internal(RequestError):
    """An engine or driver broke the contract on a unary call; never used for bad input."""

    status = Status.INTERNAL


REQUEST_ERRORS: dict[str, type[RequestError]] = {
    kind.status.name: kind
    for kind in (
        AlreadyExists,
        Cancelled,
        FailedPrecondition,
        Internal,
        InvalidArgument,
        NotFound,
        OutOfRange,
        PermissionDenied,
        ResourceExhausted,
        Unauthenticated,
        Unavailable,
        Unimplemented,
    )
}
"""Each ``RequestError`` by the name of its gRPC status: a status another gateway answered, as the error it was."""


class EngineFailure(GatewayError):
    """An application failure after acceptance; becomes one terminal ``EngineError``.

    ``code`` is an ``openengine.v1.ErrorCode`` value. ``retry_after_ms`` is kept only for
    retryable errors, as the contract requires.
    """

    def __init__(
        self,
        code: pb.ErrorCode.ValueType,
        message: str,
        *,
        retryable: bool = False,
        retry_after_ms: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms if retryable else None
        self.details = dict(details or {})

    def to_proto(self) -> pb.EngineError:
        """The ``EngineError`` message for this failure."""
        error = pb.EngineError(code=self.code, message=bounded_message(self.message), retryable=self.retryable)
        if self.retry_after_ms is not None:
            error.retry_after_ms = self.retry_after_ms
        if self.details:
            error.details.update(self.details)
        return error


class SetupError(GatewayError):
    """The gateway cannot start as asked; the command prints the message and exits with ``exit_code``."""

    exit_code: ClassVar[int] = 1


class ConfigurationError(SetupError, ValueError):
    """A setting the user must fix: a bad file, key, flag or driver option, or engines that cannot be
    served together; the message names the key. A ``ValueError`` too, so that a driver's pydantic
    validator may raise it and have it reported as the error of its key."""

    exit_code = 2


class PluginError(SetupError):
    """A backend cannot be loaded; the message says why and what to do."""

    exit_code = 2


class EngineStartError(SetupError):
    """A configured engine failed to start (its own error, logged by it, is the cause)."""

    exit_code = 1


class CapabilityError(SetupError, ValueError):
    """A started engine advertises a capability table that breaks the contract: the driver's fault."""

    exit_code = 1


def internal_failure(exc: BaseException) -> EngineFailure:
    """An unexpected exception from an accepted operation, reported without its traceback."""
    return EngineFailure(pb.ERROR_CODE_INTERNAL, f"{type(exc).__name__}: {exc}")


_CODE_BY_STATUS = {
    Status.INVALID_ARGUMENT: pb.ERROR_CODE_INVALID_ARGUMENT,
    Status.OUT_OF_RANGE: pb.ERROR_CODE_INVALID_ARGUMENT,
    Status.NOT_FOUND: pb.ERROR_CODE_INVALID_ARGUMENT,
    Status.FAILED_PRECONDITION: pb.ERROR_CODE_UNSUPPORTED_FEATURE,
    Status.UNIMPLEMENTED: pb.ERROR_CODE_UNSUPPORTED_FEATURE,
    Status.ALREADY_EXISTS: pb.ERROR_CODE_DUPLICATE_REQUEST,
    Status.RESOURCE_EXHAUSTED: pb.ERROR_CODE_OVERLOADED,
    Status.UNAVAILABLE: pb.ERROR_CODE_OVERLOADED,
    Status.CANCELLED: pb.ERROR_CODE_CANCELLED,
}


_STATUS_BY_CODE: dict[int, type[RequestError]] = {
    pb.ERROR_CODE_INVALID_ARGUMENT: InvalidArgument,
    pb.ERROR_CODE_UNSUPPORTED_FEATURE: FailedPrecondition,
    pb.ERROR_CODE_ROLE_MISMATCH: FailedPrecondition,
    pb.ERROR_CODE_MODEL_NOT_FOUND: NotFound,
    pb.ERROR_CODE_REQUEST_NOT_FOUND: NotFound,
    pb.ERROR_CODE_KV_SESSION_NOT_FOUND: NotFound,
    pb.ERROR_CODE_DUPLICATE_REQUEST: AlreadyExists,
    pb.ERROR_CODE_OVERLOADED: ResourceExhausted,
    pb.ERROR_CODE_DRAINING: Unavailable,
    pb.ERROR_CODE_KV_TRANSFER_FAILED: Unavailable,
    pb.ERROR_CODE_CANCELLED: Cancelled,
}


def as_status_error(exc: BaseException) -> RequestError:
    """The non-OK status for a failure of a unary call (unary RPCs have no error event)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, EngineFailure):
        kind = _STATUS_BY_CODE.get(exc.code, Internal)
        return kind(exc.message, retry_after_ms=exc.retry_after_ms)
    return Internal(f"{type(exc).__name__}: {exc}")


def as_failure(exc: BaseException) -> EngineFailure:
    """The terminal failure for an exception raised after acceptance.

    A ``RequestError`` raised late (a driver that validates lazily) keeps its meaning as the
    closest ``ErrorCode``; overload and unavailability stay retryable.
    """
    if isinstance(exc, EngineFailure):
        return exc
    if isinstance(exc, RequestError):
        code = _CODE_BY_STATUS.get(exc.status, pb.ERROR_CODE_INTERNAL)
        retryable = exc.status in (Status.RESOURCE_EXHAUSTED, Status.UNAVAILABLE)
        return EngineFailure(code, exc.message, retryable=retryable, retry_after_ms=exc.retry_after_ms)
    return internal_failure(exc)


__all__ = [
    "ECHO_CHARS",
    "MAX_STATUS_MESSAGE_BYTES",
    "REQUEST_ERRORS",
    "AlreadyExists",
    "Cancelled",
    "CapabilityError",
    "ConfigurationError",
    "EngineFailure",
    "EngineStartError",
    "FailedPrecondition",
    "GatewayError",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "PluginError",
    "RequestError",
    "ResourceExhausted",
    "SetupError",
    "Status",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "as_failure",
    "as_status_error",
    "bounded_message",
    "clip",
    "enum_name",
    "internal_failure",
]
