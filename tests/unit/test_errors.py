"""The error hierarchy: statuses, the two phases, and the mappings between them."""

from __future__ import annotations

import pytest
from openengine_gateway import errors, pb
from openengine_gateway.errors import (
    AlreadyExists,
    Cancelled,
    EngineFailure,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    RequestError,
    ResourceExhausted,
    Status,
    Unavailable,
    Unimplemented,
    as_failure,
    as_status_error,
)


def test_every_request_error_names_a_real_grpc_status() -> None:
    import grpc

    for name in errors.__all__:
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, RequestError):
            assert grpc.StatusCode[value.status.name] is not grpc.StatusCode.OK
    for status in Status:
        assert grpc.StatusCode[status.name].name == status.value


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (InvalidArgument, Status.INVALID_ARGUMENT),
        (NotFound, Status.NOT_FOUND),
        (AlreadyExists, Status.ALREADY_EXISTS),
        (FailedPrecondition, Status.FAILED_PRECONDITION),
        (OutOfRange, Status.OUT_OF_RANGE),
        (ResourceExhausted, Status.RESOURCE_EXHAUSTED),
        (Unavailable, Status.UNAVAILABLE),
        (Unimplemented, Status.UNIMPLEMENTED),
        (Cancelled, Status.CANCELLED),
        (Internal, Status.INTERNAL),
    ],
)
def test_request_error_status(kind: type[RequestError], status: Status) -> None:
    error = kind("why", retry_after_ms=5)
    assert error.status is status
    assert error.message == str(error) == "why"
    assert error.retry_after_ms == 5


def test_engine_failure_keeps_retry_after_only_when_retryable() -> None:
    assert EngineFailure(pb.ERROR_CODE_INTERNAL, "x", retry_after_ms=10).retry_after_ms is None
    assert EngineFailure(pb.ERROR_CODE_OVERLOADED, "x", retryable=True, retry_after_ms=10).retry_after_ms == 10


def test_engine_failure_to_proto() -> None:
    failure = EngineFailure(
        pb.ERROR_CODE_OVERLOADED,
        "busy",
        retryable=True,
        retry_after_ms=0,
        details={"queue": 3, "ranks": {"0": 7}, "ok": True},
    )
    proto = failure.to_proto()
    assert proto.code == pb.ERROR_CODE_OVERLOADED
    assert proto.message == "busy"
    assert proto.retryable
    assert proto.HasField("retry_after_ms") and proto.retry_after_ms == 0  # explicit zero: retry at once
    assert proto.details["queue"] == 3
    assert proto.details["ranks"]["0"] == 7
    assert proto.details["ok"] is True


def test_engine_failure_without_retry_hint_or_details() -> None:
    proto = EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, "bad").to_proto()
    assert not proto.retryable
    assert not proto.HasField("retry_after_ms")
    assert not proto.HasField("details")


def test_internal_failure_has_no_traceback() -> None:
    proto = errors.internal_failure(ValueError("boom")).to_proto()
    assert proto.code == pb.ERROR_CODE_INTERNAL
    assert proto.message == "ValueError: boom"
    assert not proto.retryable


@pytest.mark.parametrize(
    ("error", "code", "retryable"),
    [
        (InvalidArgument("x"), pb.ERROR_CODE_INVALID_ARGUMENT, False),
        (OutOfRange("x"), pb.ERROR_CODE_INVALID_ARGUMENT, False),
        (FailedPrecondition("x"), pb.ERROR_CODE_UNSUPPORTED_FEATURE, False),
        (Unimplemented("x"), pb.ERROR_CODE_UNSUPPORTED_FEATURE, False),
        (AlreadyExists("x"), pb.ERROR_CODE_DUPLICATE_REQUEST, False),
        (ResourceExhausted("x", retry_after_ms=50), pb.ERROR_CODE_OVERLOADED, True),
        (Unavailable("x", retry_after_ms=50), pb.ERROR_CODE_OVERLOADED, True),
        (Cancelled("x"), pb.ERROR_CODE_CANCELLED, False),
        (Internal("x"), pb.ERROR_CODE_INTERNAL, False),
    ],
)
def test_late_request_error_becomes_a_failure(error: RequestError, code: int, retryable: bool) -> None:
    """A RequestError raised after acceptance keeps its meaning as the closest ErrorCode."""
    failure = as_failure(error)
    assert failure.code == code
    assert failure.retryable is retryable
    assert failure.message == "x"
    assert failure.retry_after_ms == (50 if retryable else None)


def test_as_failure_passes_failures_through_and_wraps_bugs() -> None:
    failure = EngineFailure(pb.ERROR_CODE_KV_TRANSFER_FAILED, "lost")
    assert as_failure(failure) is failure
    wrapped = as_failure(KeyError("k"))
    assert wrapped.code == pb.ERROR_CODE_INTERNAL
    assert "KeyError" in wrapped.message


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pb.ERROR_CODE_INVALID_ARGUMENT, InvalidArgument),
        (pb.ERROR_CODE_UNSUPPORTED_FEATURE, FailedPrecondition),
        (pb.ERROR_CODE_ROLE_MISMATCH, FailedPrecondition),
        (pb.ERROR_CODE_MODEL_NOT_FOUND, NotFound),
        (pb.ERROR_CODE_REQUEST_NOT_FOUND, NotFound),
        (pb.ERROR_CODE_KV_SESSION_NOT_FOUND, NotFound),
        (pb.ERROR_CODE_DUPLICATE_REQUEST, AlreadyExists),
        (pb.ERROR_CODE_OVERLOADED, ResourceExhausted),
        (pb.ERROR_CODE_DRAINING, Unavailable),
        (pb.ERROR_CODE_KV_TRANSFER_FAILED, Unavailable),
        (pb.ERROR_CODE_CANCELLED, Cancelled),
        (pb.ERROR_CODE_INTERNAL, Internal),
        (pb.ERROR_CODE_UNSPECIFIED, Internal),
    ],
)
def test_unary_failure_status(code: int, kind: type[RequestError]) -> None:
    """Unary RPCs have no error event: an EngineFailure becomes the matching status."""
    error = as_status_error(EngineFailure(code, "m", retryable=True, retry_after_ms=7))
    assert type(error) is kind
    assert error.message == "m"
    assert error.retry_after_ms == 7


def test_as_status_error_passes_request_errors_and_wraps_bugs() -> None:
    error = NotFound("gone")
    assert as_status_error(error) is error
    wrapped = as_status_error(RuntimeError("bug"))
    assert isinstance(wrapped, Internal)
    assert wrapped.message == "RuntimeError: bug"


def test_every_error_code_has_a_status() -> None:
    """Every ErrorCode maps to a non-OK status class (INTERNAL is the fallback)."""
    for code in pb.ErrorCode.values():
        assert isinstance(as_status_error(EngineFailure(code, "m")), RequestError)


def test_a_client_string_is_quoted_whole_only_when_short() -> None:
    assert errors.clip("abc") == "'abc'"
    long = errors.clip("é" * 5000)
    assert long.startswith("'" + "é" * errors.ECHO_CHARS + "'") and long.endswith("(5000 characters)")


def test_every_message_sent_is_under_1_kib() -> None:
    assert errors.bounded_message("short") == "short"
    for text in ("a" * 5000, "日本" * 3000):
        cut = errors.bounded_message(text)
        assert len(cut.encode()) <= errors.MAX_STATUS_MESSAGE_BYTES < 1024 and cut.endswith("(cut)")
    failure = EngineFailure(pb.ERROR_CODE_INTERNAL, "z" * 10_000)
    assert len(failure.to_proto().message) <= errors.MAX_STATUS_MESSAGE_BYTES
