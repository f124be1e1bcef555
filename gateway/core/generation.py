"""Generate: validation, admission, the event stream, and cleanup, once for every driver.

``GenerationService.generate`` is an async generator of ``GenerateResponse`` messages. Until
it yields its first message it may raise a ``RequestError`` (the transport turns that into a
non-OK status); from acceptance on, every failure becomes one terminal ``EngineError`` and
the generator ends normally. Whatever way the stream ends (finished, failed, aborted, client
cancelled, deadline), the request leaves the registry and the driver is told to abort if it
had not finished, so no engine work outlives its request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from .. import pb
from ..contract.generation import parse_generate
from ..contract.lora import LoraRegistry
from ..contract.registry import ActiveRequest, RequestRegistry
from ..contract.stream import ContractViolation, GenerateEncoder
from ..engines import Engine, EngineSet
from ..errors import EngineFailure, InvalidArgument, as_failure, internal_failure
from ..spi.events import EventStream, GenerationEvent
from ..spi.requests import GenerationRequest
from .background import BackgroundTasks
from .state import GatewayState

log = logging.getLogger(__name__)


class GenerationService:
    """Runs Generate requests against the engine set."""

    def __init__(
        self,
        engines: EngineSet,
        registry: RequestRegistry,
        state: GatewayState,
        loras: LoraRegistry,
        background: BackgroundTasks,
    ) -> None:
        self._engines = engines
        self._registry = registry
        self._state = state
        self._loras = loras
        self._background = background

    def prepare(self, request: pb.GenerateRequest) -> tuple[Engine, GenerationRequest]:
        """Route and validate (pre-acceptance); raises ``RequestError``."""
        self._state.check_accepting()
        engine = self._engines.resolve(request.model)
        parsed = parse_generate(request, served_name=engine.served_name, model=engine.model_info, role=engine.role)
        if parsed.lora_name is not None:
            self._loras.get(parsed.lora_name)
        parallelism = engine.facts.parallelism
        rank = parsed.data_parallel_rank
        if rank is not None and parallelism.HasField("data_parallel_size") and rank >= parallelism.data_parallel_size:
            raise InvalidArgument(
                f"kv.data_parallel_rank {parsed.data_parallel_rank} is outside the engine's "
                f"{parallelism.data_parallel_size} data-parallel ranks"
            )
        return engine, parsed

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        """The response stream of one Generate call."""
        engine, parsed = self.prepare(request)
        active = ActiveRequest(
            parsed.request_id,
            "generate",
            engine.served_name,
            kv_session_id=parsed.kv_session.session_id if parsed.kv_session else None,
        )
        self._registry.admit(active)
        pump: asyncio.Task[None] | None = None
        finished = False
        try:
            source = engine.backend.generate(parsed)
            if isinstance(source, EventStream):
                events = source
            else:
                events, pump = pump_events(source)
            active.stop = lambda _reason: self._stop(engine, parsed.request_id, events)
            encoder = GenerateEncoder(
                parsed.request_id,
                num_outputs=parsed.sampling.num_sequences,
                prefill=engine.role == pb.ENGINE_ROLE_PREFILL,
                prompt_logprobs=parsed.prompt_logprobs is not None,
            )
        except BaseException:
            self._registry.release(active, finished=False)  # rejected: never accepted, so never finished
            raise
        try:
            failed = False
            async for message in _encode(events, encoder, active):
                failed = message.HasField("error")
                yield message
            # Only a successful stream leaves nothing running: after an error (the driver's, or a
            # contract violation while the driver still runs) the driver is told to abort too.
            finished = encoder.done and not active.aborted and not failed
        finally:
            self._registry.release(active)
            if pump is not None:
                pump.cancel()
            if not finished:
                self._background.spawn(engine.backend.abort(parsed.request_id), f"abort {parsed.request_id}")

    def _stop(self, engine: Engine, request_id: str, events: EventStream) -> None:
        """Abort path: end the stream now (open outputs finish CANCELLED) and tell the driver."""
        events.cancel()
        self._background.spawn(engine.backend.abort(request_id), f"abort {request_id}")


async def _encode(
    events: EventStream, encoder: GenerateEncoder, active: ActiveRequest
) -> AsyncIterator[pb.GenerateResponse]:
    """Encode events until the terminal response; synthesize it when the stream ends early."""
    try:
        async for event in events:
            message = encoder.encode(event)
            if message is not None:
                yield message
                if encoder.done:
                    return
    except ContractViolation as violation:
        log.error("driver broke the stream contract for %s: %s", encoder.request_id, violation)
        yield encoder.error(internal_failure(violation))
        return
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # broad on purpose: any driver failure must become one EngineError
        if not isinstance(exc, EngineFailure):
            log.exception("generation %s failed", encoder.request_id)
        if not encoder.done:
            yield encoder.error(as_failure(exc))
        return
    if encoder.done:
        return
    if events.cancelled:
        for message in encoder.cancelled(active.abort_reason or "aborted"):
            yield message
        return
    open_outputs = encoder.unfinished_outputs
    yield encoder.error(
        EngineFailure(pb.ERROR_CODE_INTERNAL, f"the engine ended the stream before finishing outputs {open_outputs}")
    )


def pump_events(source: AsyncIterator[GenerationEvent]) -> tuple[EventStream, asyncio.Task[None]]:
    """Drain a driver's async generator into an ``EventStream`` on its own task.

    The task decouples the engine from the client's pace (the stream coalesces while the
    client lags) and gives the core one place to stop the driver's generator on abort.
    """
    stream = EventStream()

    async def run() -> None:
        try:
            async for event in source:
                if stream.closed:
                    break
                stream.put(event)
            stream.finish()
        except asyncio.CancelledError:
            stream.cancel()
            raise
        except BaseException as exc:  # broad on purpose: the consumer reports it as EngineError
            stream.fail(exc)
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    return stream, asyncio.create_task(run())


__all__ = ["GenerationService", "pump_events"]
