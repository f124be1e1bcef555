"""Several frontend processes in front of the same engines (``--frontends``): what one asks the others.

Each frontend process is a whole gateway, and the kernel gives each new connection to one of them,
so a call often reaches a process that does not hold what it names. The services here answer for
the whole endpoint by asking the sibling processes (``Siblings``) for their own part:

* ``Abort`` of a request id or KV session not aborted here is asked of every sibling (with the
  caller's identity, so a token still reaches only its own requests): ABORTED wins over
  ALREADY_FINISHED, which wins over NOT_FOUND. ``all_requests`` aborts everywhere and counts all.
* ``Drain`` drains every process and reports the sums (open KV sessions are the engine's own
  figure, the same from each process: the largest is taken), COMPLETE once all are drained.
* ``LoadLora`` / ``UnloadLora`` apply here, then in every sibling, so that every process's registry
  (and driver) serves the adapter; a sibling that no longer has an adapter to unload is fine.
* ``Health`` names the process that answers in its ``grpc`` check (each process checks the
  engines itself).
* ``GetLoad``: each engine's load as the process that heard from it last reports it (a shared
  engine's figures are engine-wide; a driver stamps when it measured them).
* ``ReloadRoutes`` (the gateway's ``Routes`` service) reloads here, then in every sibling, each from
  the same file, so that every connection is routed alike (``server.routes_servicer``).

What reaches a sibling is answered there from its own state alone, never asked further.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from .. import pb
from ..errors import EngineFailure, NotFound, RequestError, as_failure
from .discovery import DiscoveryService
from .lifecycle import LifecycleService, drain_response
from .lora import LoraService


class Siblings(Protocol):
    """The other frontend processes; each call is answered by each of them from its own state,
    for the caller bound to the current task (``callers``)."""

    @property
    def here(self) -> str:
        """This process among them, as Health's ``grpc`` check names it (``frontend 2 of 4, pid 1234``)."""

    async def abort(self, request: pb.AbortRequest) -> list[pb.AbortResponse | RequestError]:
        """Each sibling's answer to an Abort of a request id or KV session."""

    async def abort_all_requests(self, reason: str) -> int:
        """Abort every sibling's requests in flight; how many in all."""

    def drains(self, request: pb.DrainRequest) -> list[AsyncIterator[pb.DrainResponse]]:
        """Each sibling's Drain stream."""

    async def load_lora(self, request: pb.LoadLoraRequest) -> None:
        """Load the adapter in every sibling; raises the first sibling's error."""

    async def unload_lora(self, request: pb.UnloadLoraRequest) -> None:
        """Unload the adapter from every sibling that has it; raises the first other error."""

    async def engine_loads(self) -> list[list[pb.LoadInfo]]:
        """Each sibling's ``DiscoveryService.engine_loads``."""

    async def reload_routes(self) -> None:
        """Reload every sibling's routes from the configuration file; raises the first sibling's refusal."""


_RANK = {pb.ABORT_STATUS_ABORTED: 0, pb.ABORT_STATUS_ALREADY_FINISHED: 1}


def merged_abort(answers: Sequence[pb.AbortResponse | RequestError]) -> pb.AbortResponse:
    """One answer for the endpoint from each process's (this one's first): the best status any
    process gave, else the first error that is not NOT_FOUND, else this process's NOT_FOUND."""
    responses = sorted(
        (answer for answer in answers if isinstance(answer, pb.AbortResponse)),
        key=lambda response: _RANK.get(response.status, len(_RANK)),
    )
    if responses:
        return responses[0]
    errors = [answer for answer in answers if isinstance(answer, RequestError)]
    raise next((error for error in errors if not isinstance(error, NotFound)), errors[0])


def freshest(loads: Sequence[pb.LoadInfo]) -> pb.LoadInfo:
    """The load measured last (an unstamped one counts as oldest; the first wins a tie)."""
    return max(loads, key=lambda load: load.timestamp_unix_nanos if load.HasField("timestamp_unix_nanos") else -1)


async def merged_drains(streams: Sequence[AsyncIterator[pb.DrainResponse]]) -> AsyncIterator[pb.DrainResponse]:
    """One Drain stream from every process's: STARTED once each has started, IN_PROGRESS on each
    change of the sums, COMPLETE once each is complete; the first error any sends ends it."""
    queue: asyncio.Queue[tuple[int, pb.DrainResponse | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[pb.DrainResponse]) -> None:
        try:
            async for message in stream:
                queue.put_nowait((index, message))
        except Exception as exc:  # broad on purpose: a sibling's failure is this drain's terminal error
            queue.put_nowait((index, pb.DrainResponse(error=as_failure(exc).to_proto())))
        finally:
            queue.put_nowait((index, None))

    pumps = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    latest: dict[int, pb.DrainResponse] = {}
    reported: tuple[int, int | None] | None = None
    running = len(streams)
    try:
        while running:
            index, message = await queue.get()
            if message is None:
                running -= 1
                continue
            if message.HasField("error"):
                yield message
                return
            latest[index] = message
            if len(latest) < len(streams):
                continue
            counts = _sums(latest.values())
            if all(each.state == pb.DRAIN_STATE_COMPLETE for each in latest.values()):
                yield drain_response(pb.DRAIN_STATE_COMPLETE, counts, "drained")
                return
            if reported is None or counts != reported:
                state = pb.DRAIN_STATE_STARTED if reported is None else pb.DRAIN_STATE_IN_PROGRESS
                yield drain_response(state, counts, "drain started" if reported is None else "draining")
                reported = counts
        failure = EngineFailure(pb.ERROR_CODE_INTERNAL, "a frontend process's drain ended without completing")
        yield pb.DrainResponse(error=failure.to_proto())
    finally:
        for task in pumps:
            task.cancel()
        for task in pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _sums(messages: Any) -> tuple[int, int | None]:
    in_flight = 0
    sessions: int | None = None
    for message in messages:
        in_flight += message.in_flight_requests
        if message.HasField("open_kv_sessions"):
            sessions = max(sessions or 0, message.open_kv_sessions)
    return in_flight, sessions


class PeeredLifecycle(LifecycleService):
    """Abort and Drain for the whole endpoint; the ``*_here`` methods answer a sibling."""

    def __init__(self, siblings: Siblings, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._siblings = siblings

    async def health(self, request: pb.HealthRequest) -> pb.HealthResponse:
        """Health as one process sees it, naming the process in its ``grpc`` check (a connection
        stays with one process: an operator, or a test, can tell which answers)."""
        response = await super().health(request)
        for check in response.checks:
            if check.name == "grpc":
                check.message = f"{check.message} ({self._siblings.here})"
        return response

    async def abort(self, request: pb.AbortRequest) -> pb.AbortResponse:
        target = request.WhichOneof("target")
        if target not in ("request_id", "kv_session"):
            return await super().abort(request)  # all_requests reaches the siblings through abort_all_requests
        local: pb.AbortResponse | RequestError
        try:
            local = await super().abort(request)
        except NotFound as missing:
            local = missing
        if target == "request_id" and isinstance(local, pb.AbortResponse) and local.status == pb.ABORT_STATUS_ABORTED:
            return local
        return merged_abort([local, *await self._siblings.abort(request)])

    async def abort_here(self, request: pb.AbortRequest) -> pb.AbortResponse:
        """A sibling's Abort of a request id or KV session, answered from this process alone."""
        return await super().abort(request)

    async def abort_all_requests(self, reason: str) -> int:
        return await self.abort_all_here(reason) + await self._siblings.abort_all_requests(reason)

    async def abort_all_here(self, reason: str) -> int:
        """A sibling's Abort(all_requests): this process's requests only."""
        return await super().abort_all_requests(reason)

    async def drain(self, request: pb.DrainRequest) -> AsyncIterator[pb.DrainResponse]:
        async for message in merged_drains([super().drain(request), *self._siblings.drains(request)]):
            yield message

    def drain_here(self, request: pb.DrainRequest) -> AsyncIterator[pb.DrainResponse]:
        """A sibling's Drain: this process's."""
        return super().drain(request)


class PeeredLora(LoraService):
    """LoadLora and UnloadLora in every process; ``*_here`` answer a sibling."""

    def __init__(self, siblings: Siblings, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._siblings = siblings

    async def load(self, request: pb.LoadLoraRequest) -> pb.LoadLoraResponse:
        response = await super().load(request)
        await self._siblings.load_lora(request)  # also when loaded here already: a sibling may lack it
        return response

    async def load_here(self, request: pb.LoadLoraRequest) -> pb.LoadLoraResponse:
        """A sibling's LoadLora: this process's registry and driver."""
        return await super().load(request)

    async def unload(self, request: pb.UnloadLoraRequest) -> pb.UnloadLoraResponse:
        response = await super().unload(request)
        await self._siblings.unload_lora(request)
        return response

    async def unload_here(self, request: pb.UnloadLoraRequest) -> pb.UnloadLoraResponse:
        """A sibling's UnloadLora: this process's registry and driver."""
        return await super().unload(request)


class PeeredDiscovery(DiscoveryService):
    """GetLoad with each engine's freshest load among the processes."""

    def __init__(self, siblings: Siblings, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._siblings = siblings

    async def engine_loads(self) -> list[pb.LoadInfo]:
        here = await super().engine_loads()
        theirs = await self._siblings.engine_loads()
        return [freshest(column) for column in zip(here, *theirs, strict=True)]

    async def engine_loads_here(self) -> list[pb.LoadInfo]:
        """A sibling's question: this process's view of each engine's load."""
        return await super().engine_loads()


__all__ = [
    "PeeredDiscovery",
    "PeeredLifecycle",
    "PeeredLora",
    "Siblings",
    "freshest",
    "merged_abort",
    "merged_drains",
]
