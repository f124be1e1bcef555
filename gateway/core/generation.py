"""Generate: validation, admission, the event stream, and cleanup, once for every driver.

``GenerationService.generate`` is an async generator of ``GenerateResponse`` messages. Until
it yields its first message it may raise a ``RequestError`` (the transport turns that into a
non-OK status): from validation, or from the driver's stream before its first message (a
proxy such as ``remote`` learns its remote's verdict only then). From acceptance on, every
failure becomes one terminal ``EngineError`` and the generator ends normally. Whatever way
the stream ends (finished, failed, aborted, client cancelled, deadline), the request leaves
the registry and the driver is told to abort if it had not finished, so no engine work
outlives its request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Container

from .. import pb
from ..contract.bounds import DEFAULT_BOUNDS, FieldBounds, check_generate_fields
from ..contract.generation import parse_generate
from ..contract.limits import RequestLimits, check_generate
from ..contract.stream import ContractViolation, GenerateEncoder
from ..engines import Engine, EngineSet
from ..errors import EngineFailure, InvalidArgument, RequestError, as_failure, internal_failure
from ..logs import bind_request_id
from ..routes import Route
from ..spi.events import EventStream, TokenDelta
from ..spi.requests import GenerationRequest
from .aborts import abort_in_engine, abort_then_release
from .background import BackgroundTasks
from .callers import current_caller, scoped_id
from .driver_faults import DriverFaults, escaped, open_stream
from .lora import LoraRegistry
from .mirror import Mirroring, SideRecorder
from .registry import ActiveRequest, RequestRegistry
from .state import GatewayState
from .stream_end import Ending, StreamEnd
from .telemetry import OK, REJECTED, EngineStats, StreamClock, Telemetry
from .unread import UnreadLedger, UnreadMeter

log = logging.getLogger(__name__)

ENDING_CODES = {
    Ending.FINISHED: OK,
    Ending.FAILED: "INTERNAL",
    Ending.ABORTED: "ABORTED",
    Ending.CANCELLED: "CANCELLED",
}
"""The code counted for a stream that ended so (a failed one's is its ``EngineError`` code when it has one)."""
REPORTED_ABORT_GRACE_S = 5.0
"""How long an engine that reports its own cancellation has to end an aborted stream."""


class GenerationService:
    """Runs Generate requests against the engine set."""

    def __init__(
        self,
        engines: EngineSet,
        registry: RequestRegistry,
        state: GatewayState,
        loras: LoraRegistry,
        background: BackgroundTasks,
        *,
        limits: RequestLimits | None = None,
        bounds: FieldBounds = DEFAULT_BOUNDS,
        telemetry: Telemetry | None = None,
        mirroring: Mirroring | None = None,
        unread: UnreadLedger | None = None,
    ) -> None:
        self._engines = engines
        self._registry = registry
        self._state = state
        self._loras = loras
        self._background = background
        self._limits = limits or RequestLimits()
        self._bounds = bounds
        self._telemetry = telemetry
        self._mirroring = mirroring
        self._unread = unread or UnreadLedger()

    def prepare(self, request: pb.GenerateRequest) -> tuple[Route, Engine, GenerationRequest]:
        """Route and validate (pre-acceptance); raises ``RequestError``. A split's request is checked
        against what the split advertises, so it is valid on whichever engine takes it."""
        self._state.check_accepting()
        check_generate_fields(request, self._bounds)
        route = self._engines.route(request.model)  # an unknown model is NOT_FOUND first
        check_generate(request, self._limits)
        route.check_token_ids(request)
        engine = _pick(route, request, self._state.engines_down)
        self._state.check_engine(engine.served_name)
        parsed = parse_generate(request, served_name=engine.served_name, model=route.model_info, role=engine.role)
        if parsed.lora_name is not None:
            self._loras.get(parsed.lora_name)
        if parsed.data_parallel_rank is not None:
            rank = engine.ranks.to_engine(parsed.data_parallel_rank)
            parallelism = engine.facts.parallelism
            if parallelism.HasField("data_parallel_size") and rank >= parallelism.data_parallel_size:
                raise InvalidArgument(
                    f"kv.data_parallel_rank {parsed.data_parallel_rank} is outside the engine's "
                    f"{parallelism.data_parallel_size} data-parallel ranks"
                )
            if rank != parsed.data_parallel_rank:
                parsed = dataclasses.replace(parsed, data_parallel_rank=rank)
        return route, engine, parsed

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        """The response stream of one Generate call."""
        arrived = time.perf_counter()
        route, engine, parsed = self.prepare(request)
        owner = current_caller().name
        client_id = parsed.request_id
        parsed = dataclasses.replace(parsed, request_id=scoped_id(owner, client_id))  # what the engine knows
        bind_request_id(parsed.request_id)
        active = ActiveRequest(
            parsed.request_id,
            "generate",
            engine.served_name,
            client_id=client_id,
            kv_session_id=parsed.kv_session.session_id if parsed.kv_session else None,
            owner=owner,
        )
        self._registry.admit(active)
        stats = self._telemetry.stats(engine.served_name, route.split_of(engine)) if self._telemetry else None
        try:
            events, encoder, meter = self._open(engine, parsed, active)
        except BaseException as refused:
            self._registry.release(active, finished=False)  # rejected: never accepted, so never finished
            if stats is not None and isinstance(refused, RequestError):
                stats.ended("generate", REJECTED, refused.status.name)
            raise
        copy = None
        end = StreamEnd()
        clock = StreamClock(stats, arrived) if stats is not None else None
        try:
            if route.mirror is not None and self._mirroring is not None:
                copy = self._mirroring.copy(route, engine, request)
            async for message in _encode(events, encoder, active, engine.faults, clock, copy.primary if copy else None):
                end.final = message
                active.ended = encoder.done  # from its final message on, an Abort finds it finished
                yield message
            end.read_all(complete=encoder.done)
        except RequestError as refused:
            end.rejected = True  # refused before its first message
            if stats is not None:
                stats.ended("generate", REJECTED, refused.status.name)
            raise
        finally:
            active.ended = True
            ending = self._close(engine, active, events, end)
            meter.close()
            if stats is not None and clock is not None and ending is not Ending.REJECTED:
                clock.ended()
                _account(stats, end.final, ending)
            if copy is not None:
                copy.primary_ended(finished=ending is Ending.FINISHED)

    def _open(
        self, engine: Engine, parsed: GenerationRequest, active: ActiveRequest
    ) -> tuple[EventStream, GenerateEncoder, UnreadMeter]:
        """Start the driver's stream and wire the request's abort and failure paths, and its meter of
        unread tokens, to it."""
        events = open_stream(engine.backend, engine.faults, parsed)
        active.stop = lambda _reason: self._stop(engine, active, events)
        active.on_failure = events.fail
        overflow = lambda: abort_in_engine(self._background, engine, active)  # noqa: E731 (one line)
        caller = current_caller()  # a token's streams share its bound; without a token, a connection's do
        events.meter = meter = self._unread.meter(caller.name or caller.peer, overflow)
        prefill = engine.role == pb.ENGINE_ROLE_PREFILL
        if prefill:
            events.on_abandoned = lambda session: self._release(engine, session.session_id)
        encoder = GenerateEncoder(
            active.client_id,
            num_outputs=parsed.sampling.num_sequences,
            prefill=prefill,
            prompt_logprobs=parsed.prompt_logprobs is not None,
        )
        return events, encoder, meter

    def _close(self, engine: Engine, active: ActiveRequest, events: EventStream, end: StreamEnd) -> Ending:
        """Free what the stream held, as the way it ended requires; returns how it ended."""
        ending = end.ending(aborted=active.aborted)
        if ending is Ending.FINISHED or ending is Ending.REJECTED:  # nothing runs in the driver: the id is free now
            self._registry.release(active, finished=ending is Ending.FINISHED)
        else:  # nobody reads the stream any more: what the driver still puts is dropped
            events.cancel()
            abort_then_release(self._background, self._registry, engine, active)
        final = end.final
        if final is not None and final.HasField("prefill_ready"):
            session_id = final.prefill_ready.kv_session.session_id
            if end.written:
                self._registry.remember_session(session_id, active.owner)
            else:  # the client went away while its handoff was being written
                self._release(engine, session_id)
        events.detach()
        return ending

    def _release(self, engine: Engine, session_id: str) -> None:
        """Free a prefill's KV session that no client received (the stream ended before its handoff)."""
        self._background.spawn(engine.backend.abort_kv_session(session_id), f"release {session_id}")

    def _stop(self, engine: Engine, active: ActiveRequest, events: EventStream) -> None:
        """Abort path: end the stream now (open outputs finish CANCELLED) and tell the driver.

        An engine that reports its own cancellation (a proxy) ends the stream with its terminal
        events; the core ends it only if that has not happened within ``REPORTED_ABORT_GRACE_S``.
        """
        if engine.facts.reports_cancellation:
            asyncio.get_running_loop().call_later(REPORTED_ABORT_GRACE_S, _cancel_if_open, events)
        else:
            events.cancel()
        abort_in_engine(self._background, engine, active)  # now, even while a slow client holds the stream


def _pick(route: Route, request: pb.GenerateRequest, down: Container[str]) -> Engine:
    """The engine of ``route`` for this request: a split's engine owning the requested rank, else by
    the request's sticky key or weight, among the engines not ``down`` while any is up."""
    kv = request.kv
    if route.is_split and kv.HasField("data_parallel_rank"):
        return route.by_rank(kv.data_parallel_rank)
    cache_salt = kv.cache_salt if kv.HasField("cache_salt") else None
    return route.pick(cache_salt=cache_salt, metadata=request.metadata, down=down)


def _cancel_if_open(events: EventStream) -> None:
    if not events.closed:
        events.cancel()


def _account(stats: EngineStats, final: pb.GenerateResponse | None, ending: Ending) -> None:
    """Count how an accepted stream ended (a failure by its ``EngineError`` code), and its tokens when its
    final message carried usage."""
    if ending is Ending.FAILED and final is not None:
        code = pb.ErrorCode.Name(final.error.code).removeprefix("ERROR_CODE_")
    else:
        code = ENDING_CODES[ending]
    stats.ended("generate", ending.value, code)
    if final is not None and final.HasField("usage"):
        stats.prompt_tokens += final.usage.prompt_tokens
        stats.completion_tokens += final.usage.completion_tokens
    log.debug("generate ended: %s", ending.value)


async def _encode(
    events: EventStream,
    encoder: GenerateEncoder,
    active: ActiveRequest,
    faults: DriverFaults,
    clock: StreamClock | None = None,
    tap: SideRecorder | None = None,
) -> AsyncIterator[pb.GenerateResponse]:
    """Encode events until the terminal response; synthesize it when the stream ends early. ``tap``
    records a mirrored request's events for its comparison. What the driver's stream raises and the
    events that break the stream contract are the driver's mistakes (``faults``); an exception of the
    encoder's own is the gateway's, INTERNAL."""
    sent = False
    stream = aiter(events)
    while True:
        try:
            event = await anext(stream)
        except StopAsyncIteration:
            break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broad on purpose: any driver failure must become one EngineError
            if isinstance(exc, RequestError) and not sent:
                raise  # nothing was sent: the driver refused the request before acceptance
            if not encoder.done:
                yield encoder.error(_driver_failure(exc, faults))
            return
        if tap is not None:
            tap.record(event)
        try:
            message = encoder.encode(event)
        except ContractViolation as violation:
            yield encoder.error(faults.failure(f"its events broke the stream contract: {violation}"))
            return
        except Exception as exc:  # broad on purpose: the gateway's own bug still ends the stream once
            log.exception("generation %s failed", encoder.request_id)
            yield encoder.error(internal_failure(exc))
            return
        if message is not None:
            sent = True
            if clock is not None and type(event) is TokenDelta:
                clock.token()
            yield message
            if encoder.done:
                return
    if encoder.done:
        return
    if events.cancelled:
        for message in encoder.cancelled(active.abort_reason or "aborted"):
            yield message
        return
    open_outputs = encoder.unfinished_outputs
    yield encoder.error(faults.failure(f"its stream ended before finishing outputs {open_outputs}"))


def _driver_failure(exc: Exception, faults: DriverFaults) -> EngineFailure:
    """The terminal failure for what a driver's stream raised: its own failures and late refusals keep
    their meaning; anything else escaped the driver."""
    if isinstance(exc, EngineFailure | RequestError):
        return as_failure(exc)
    return faults.failure(f"its event stream raised {escaped(exc)}", exc)


__all__ = ["REPORTED_ABORT_GRACE_S", "GenerationService"]
