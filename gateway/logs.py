"""Log lines for operators: plain text or one JSON object per line, with request ids.

The core binds the id of the request it is serving to the running task
(``bind_request_id``); every line logged while serving it carries that id, in text as a
``[request_id]`` prefix and in JSON as the ``request_id`` key, so one grep finds a request's
whole story. Credentials never reach a log line: a refused call is counted by status in the
metrics, and neither a token nor its digest is ever formatted into a message.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]

_REQUEST_ID: ContextVar[str | None] = ContextVar("openengine_request_id", default=None)
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(request)s%(message)s"


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
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


__all__ = ["JsonFormatter", "LogFormat", "RequestIdFilter", "bind_request_id", "configure"]
