"""Gateway-wide admission state: starting, serving, draining."""

from __future__ import annotations

from ..errors import Unavailable


class GatewayState:
    """Whether new requests are admitted. Draining is one-way: a drained gateway stays closed."""

    def __init__(self) -> None:
        self.started = False
        self.draining = False

    def check_accepting(self) -> None:
        """Raise UNAVAILABLE (retryable elsewhere) unless new requests are admitted."""
        if not self.started:
            raise Unavailable("the gateway is starting", retry_after_ms=1000)
        if self.draining:
            raise Unavailable("the gateway is draining and accepts no new requests", retry_after_ms=1000)


__all__ = ["GatewayState"]
