"""Log lines for operators: plain text or one JSON object per line, with request ids.

The core binds the id of the request it is serving to the running task
(``bind_request_id``); every line logged while serving it carries that id, in text as a
``[request_id]`` prefix and in JSON as the ``request_id`` key, so one grep finds a request's
whole story. Credentials never reach a log line: a refused call is counted by status in the
metrics, and neither a token nor its digest is ever formatted into a message.

Other code logs what it was sent, though: grpc's Cython layer logs a metadata value that is
not UTF-8 ("Invalid encoding on b'Bearer <token>\\xff'") at ERROR through Python logging,
whole (grpc's C core logs no metadata value, even with ``GRPC_TRACE``). ``redact_grpc`` puts a
filter on that logger which replaces the value by its length, and ``configure`` puts
``RedactSecrets`` on the root handler, which blanks any ``Bearer`` credential in any line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]

_REQUEST_ID: ContextVar[str | None] = ContextVar("openengine_request_id", default=None)
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(request)s%(message)s"
_BEARER = re.compile(r"(?i)\b(bearer)(\s+|%20)[^\s'\",;]+")
_GRPC_LOGGER = "grpc._cython.cygrpc"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters a terminal or a line-based reader acts on: newlines, escape sequences, C1 controls."""
_GRPC_INVALID_ENCODING = "Invalid encoding on %s"


def bind_request_id(request_id: str) -> None:
    """Tag every line the current task logs from now on with ``request_id``."""
    _REQUEST_ID.set(request_id)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (None outside a request) to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(record, "request_id", None) or _REQUEST_ID.get()
        record.request_id = request_id
        record.request = f"[{request_id}] " if request_id else ""
        return True


class RedactSecrets(logging.Filter):
    """Blanks every ``Bearer`` credential in a record's message, whichever code logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _BEARER.sub(r"\1 <redacted>", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class _GrpcMetadataFilter(logging.Filter):
    """grpc logs an undecodable metadata value whole, with a traceback: keep only its length.

    Whichever header it was (``authorization`` included), its value is the client's and may be
    a secret; the line becomes one WARNING without the value or the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _GRPC_INVALID_ENCODING and isinstance(record.args, tuple) and record.args:
            value = record.args[0]
            size = len(value) if isinstance(value, bytes | str) else 0
            record.msg = "a client sent a metadata value that is not UTF-8 (%d bytes, not logged)"
            record.args = (size,)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_GRPC_FILTER = _GrpcMetadataFilter()


def redact_grpc() -> None:
    """Install the filter on grpc's logger (once; a server calls it whatever its log setup)."""
    logger = logging.getLogger(_GRPC_LOGGER)
    if _GRPC_FILTER not in logger.filters:
        logger.addFilter(_GRPC_FILTER)


def escape_controls(text: str) -> str:
    """``text`` with each control character as its Python escape (a newline as ``\\n``, ESC as ``\\x1b``)."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


class TextFormatter(logging.Formatter):
    """The text format, one line per record: the message and the request id are written with their control
    characters escaped, so a client's value (a request id, a model name) can neither start a forged line nor
    send a terminal escape sequence. A traceback, the gateway's own, keeps its lines."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        saved = record.msg, record.args, getattr(record, "request", "")
        record.msg, record.args = escape_controls(record.getMessage()), None
        record.request = escape_controls(saved[2])
        try:
            return super().format(record)
        finally:
            record.msg, record.args, record.request = saved


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, log_format: LogFormat = "text") -> None:
    """Route the root logger to stderr in ``log_format`` at ``level`` (replacing its handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(RedactSecrets())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


__all__ = [
    "JsonFormatter",
    "LogFormat",
    "RedactSecrets",
    "RequestIdFilter",
    "TextFormatter",
    "bind_request_id",
    "configure",
    "redact_grpc",
]
