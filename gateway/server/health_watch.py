"""grpc.health.v1 with its streams bounded: per connection, in all, and by the memory budget.

``Health/Watch`` needs no token (load balancers probe it), so it is the one stream anyone who
reaches the port can open. grpc's own servicer holds every Watch for as long as its client
keeps it, under any service name: 10,000 streams on one connection, or 20 whose names are 60
MiB each, were held for as long as the connection lived. Here a name longer than any service
name is INVALID_ARGUMENT before the stream is held, and a Watch past the bounds per connection
(by its peer address, one per connection) or in all, or past the memory budget, is
RESOURCE_EXHAUSTED with a retry hint. A load balancer watches one or two names per connection.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from ..core.memory import RETRY_AFTER_MS, MemoryBudget
from ..errors import InvalidArgument, RequestError, ResourceExhausted, bounded_message
from .servicer import reject

MAX_SERVICE_CHARS = 256
"""The longest service name Check or Watch accepts: a fully qualified gRPC service name fits."""

_Context = grpc.aio.ServicerContext[Any, Any]


class BoundedHealthServicer(health.aio.HealthServicer):
    """grpc's health servicer, with at most ``max_watches`` Watch streams in all and
    ``max_watches_per_connection`` on one connection, none while ``memory`` sheds."""

    def __init__(self, *, max_watches: int, max_watches_per_connection: int, memory: MemoryBudget) -> None:
        super().__init__()
        self._max = max_watches
        self._max_per_connection = max_watches_per_connection
        self._memory = memory
        self._by_connection: Counter[str] = Counter()
        self.watches = 0
        """Watch streams open now."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: _Context) -> health_pb2.HealthCheckResponse:
        if len(request.service) > MAX_SERVICE_CHARS:
            await reject(context, _long_name(request.service))
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: _Context) -> None:
        peer = context.peer()
        try:
            self._admit(request.service, peer)
        except RequestError as error:
            _end(context, error)  # not raised: an exception's traceback would keep the request until a gc pass
            return
        self._by_connection[peer] += 1
        self.watches += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watches -= 1
            self._by_connection[peer] -= 1
            if not self._by_connection[peer]:
                del self._by_connection[peer]

    def _admit(self, service: str, peer: str) -> None:
        if len(service) > MAX_SERVICE_CHARS:
            raise _long_name(service)
        if self._by_connection[peer] >= self._max_per_connection:
            raise ResourceExhausted(
                f"this connection holds {self._max_per_connection} health watches, its limit "
                "(--max-health-watches-per-connection)",
                retry_after_ms=RETRY_AFTER_MS,
            )
        if self.watches >= self._max:
            raise ResourceExhausted(
                f"the gateway holds {self._max} health watches, its limit (--max-health-watches)",
                retry_after_ms=RETRY_AFTER_MS,
            )
        self._memory.check("health watch")


def _end(context: _Context, error: RequestError) -> None:
    """End the call with ``error``'s status (and retry hint) once the handler returns."""
    if error.retry_after_ms is not None:
        context.set_trailing_metadata((("retry-after-ms", str(error.retry_after_ms)),))
    context.set_code(grpc.StatusCode[error.status.name])
    context.set_details(bounded_message(error.message))


def _long_name(service: str) -> InvalidArgument:
    return InvalidArgument(
        f"a service name is at most {MAX_SERVICE_CHARS} characters; this one is {len(service)} characters"
    )


__all__ = ["MAX_SERVICE_CHARS", "BoundedHealthServicer"]
