"""The audit record: who drained, loaded or unloaded an adapter, aborted everything, or was refused.

One INFO line per such call on the ``openengine_gateway.audit`` logger, naming the caller by
its token's name or certificate subject and its peer address, never by a token. Calls that
change what every client sees are rare, so the record costs nothing on the request path.
"""

from __future__ import annotations

import logging

from .callers import Caller, current_caller

log = logging.getLogger("openengine_gateway.audit")


def audit(action: str, caller: Caller | None = None) -> None:
    """Record ``action`` (what was done or refused) by ``caller`` (the bound one by default)."""
    log.info("audit: %s by %s", action, (caller or current_caller()).describe())


__all__ = ["audit"]
