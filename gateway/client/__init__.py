"""A Python client for any OpenEngine v1 server (this gateway or another implementation)."""

from .client import (
    CLIENT_REVISION,
    TESTED_RELEASES,
    TESTED_SERVER_REVISIONS,
    Completion,
    OpenEngineClient,
    Output,
    check_compatible,
    text_request,
)
from .errors import ClientError, EngineErrorEvent, IncompatibleServer, NotInLayout, StatusError
from .layouts import LAYOUTS, GenerateCall, Layout
from .sync import SyncClient

__all__ = [
    "CLIENT_REVISION",
    "LAYOUTS",
    "TESTED_RELEASES",
    "TESTED_SERVER_REVISIONS",
    "ClientError",
    "Completion",
    "EngineErrorEvent",
    "GenerateCall",
    "IncompatibleServer",
    "Layout",
    "NotInLayout",
    "OpenEngineClient",
    "Output",
    "StatusError",
    "SyncClient",
    "check_compatible",
    "text_request",
]
