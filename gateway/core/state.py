"""Gateway-wide admission state: starting, serving, draining, and which engines are down."""

from __future__ import annotations

from ..errors import Unavailable


class GatewayState:
    """Whether new requests are admitted. Draining is one-way: a drained gateway stays closed."""

    def __init__(self) -> None:
        self.started = False
        self.draining = False
        self.engines_down: dict[str, str] = {}
        """Served name → why, for engines the monitor found NOT_READY (``core.monitor``)."""

    def check_accepting(self) -> None:
        """Raise UNAVAILABLE (retryable elsewhere) unless new requests are admitted."""
        if not self.started:
            raise Unavailable("the gateway is starting", retry_after_ms=1000)
        if self.draining:
            raise Unavailable("the gateway is draining and accepts no new requests", retry_after_ms=1000)

    def check_engine(self, served_name: str) -> None:
        """Raise UNAVAILABLE (retryable once it recovers) while that engine is down."""
        reason = self.engines_down.get(served_name)
        if reason is not None:
            raise Unavailable(f"the engine serving {served_name!r} is not ready: {reason}", retry_after_ms=1000)


__all__ = ["GatewayState"]
