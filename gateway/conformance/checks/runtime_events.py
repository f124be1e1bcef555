"""The runtime-event stream: typed events, filtered by the requested types."""

from __future__ import annotations

import asyncio

import grpc

from ... import pb
from ...client import StatusError
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import check_engine_error

SECTION = "Runtime observability"
_WAIT_S = 5.0


@rule(
    "runtime-events.type-filter",
    SECTION,
    "SubscribeRuntimeEventsRequest.types selects the RuntimeEventTypes delivered; every RuntimeEvent carries its "
    "event_id, timestamp and type.",
)
async def type_filter(target: Target) -> None:
    target.require_generation()
    wanted = pb.RUNTIME_EVENT_TYPE_FORWARD_PASS
    request = pb.SubscribeRuntimeEventsRequest(types=[wanted])
    stream = target.client.runtime_events(request, timeout_s=target.timeout_s)
    first = asyncio.ensure_future(anext(stream))
    try:
        received: list[pb.RuntimeEvent] = []
        await asyncio.sleep(0.1)  # let the subscription open before the engine works
        if first.done():
            first.result()  # a rejection (UNIMPLEMENTED) surfaces here
        generation = asyncio.ensure_future(target.run(target.prompt(max_tokens=4)))
        response = await asyncio.wait_for(first, _WAIT_S)
        while True:
            if response.HasField("error"):
                check_engine_error(response.error, "the runtime-event stream's EngineError")
                raise CheckFailed(f"the runtime-event stream failed: {response.error.message}")
            received.append(response.runtime_event)
            if len(received) >= 2:
                break
            response = await asyncio.wait_for(anext(stream), _WAIT_S)
        await generation
    except StatusError as error:
        if error.code == grpc.StatusCode.UNIMPLEMENTED:
            raise NotApplicable("the server has no runtime-event stream (UNIMPLEMENTED)") from None
        raise
    except TimeoutError:
        raise NotApplicable(f"no forward-pass runtime event arrived within {_WAIT_S:g}s") from None
    finally:
        first.cancel()
        await stream.aclose()  # type: ignore[attr-defined]
    for event in received:
        if event.type != wanted:
            raise CheckFailed(f"subscribed to FORWARD_PASS, received {pb.RuntimeEventType.Name(event.type)}")
        if not event.event_id or not event.timestamp_unix_nanos:
            raise CheckFailed(f"a runtime event lacks its id or timestamp: {event}")


__all__: list[str] = []
