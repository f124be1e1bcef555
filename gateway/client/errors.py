"""Client-side errors: a non-OK status (or an RPC the layout lacks), a terminal ``EngineError`` event, or an
incompatible server."""

from __future__ import annotations

import grpc

from .. import pb


class ClientError(Exception):
    """Base of every error the OpenEngine client raises."""


class StatusError(ClientError):
    """The server answered with a non-OK gRPC status (the request was not accepted, or a
    unary call failed). ``retry_after_ms`` carries the server's hint when it sent one."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.retry_after_ms = retry_after_ms

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError) -> StatusError:
        """Wrap a grpc error, reading the ``retry-after-ms`` trailing entry if present."""
        retry_after = None
        for key, value in error.trailing_metadata() or ():
            if key == "retry-after-ms":
                try:
                    retry_after = int(value)
                except ValueError:
                    retry_after = None
        return cls(error.code(), error.details() or "", retry_after)


class NotInLayout(StatusError):
    """What the layout the client speaks cannot say, refused by the client without a call: an RPC it does
    not have (UNIMPLEMENTED, as the server would answer: the later layout has no Drain) or a request field
    with no place in it (INVALID_ARGUMENT: the seed's ``GenerateRequest.metadata``)."""

    def __init__(self, code: grpc.StatusCode, details: str, layout: str) -> None:
        super().__init__(code, details)
        self.layout = layout


class EngineErrorEvent(ClientError):
    """An accepted operation failed: the stream ended with a terminal ``EngineError``."""

    def __init__(self, error: pb.EngineError) -> None:
        super().__init__(f"{pb.ErrorCode.Name(error.code)}: {error.message}")
        self.error = error

    @property
    def code(self) -> int:
        """The ``ErrorCode``."""
        return self.error.code

    @property
    def retryable(self) -> bool:
        """Whether the unchanged operation can succeed on retry."""
        return self.error.retryable

    @property
    def retry_after_ms(self) -> int | None:
        """The recommended minimum delay before a retry, when the server gave one."""
        return self.error.retry_after_ms if self.error.HasField("retry_after_ms") else None


class IncompatibleServer(ClientError):
    """The server's schema revision or release is outside what this client was tested with."""


__all__ = ["ClientError", "EngineErrorEvent", "IncompatibleServer", "NotInLayout", "StatusError"]
