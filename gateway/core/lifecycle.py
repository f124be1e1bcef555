"""Health, Abort and Drain: the gateway-wide lifecycle, the same for every driver."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence

from .. import pb
from ..contract.bounds import DEFAULT_BOUNDS, FieldBounds, check_abort_fields
from ..engines import Engine, EngineSet
from ..errors import EngineFailure, InvalidArgument, NotFound, Unimplemented, as_failure, clip
from ..spi.events import OutputFinished, PrefillDone
from ..spi.requests import ClassifyCall, EmbedCall, GenerationRequest, Stopping, TaskContext, TaskItem
from .audit import audit
from .callers import current_caller
from .driver_faults import open_stream
from .health import engine_checks, worst
from .rates import RateLimit
from .registry import ActiveRequest, RequestRegistry
from .results import health_message
from .state import GatewayState

log = logging.getLogger(__name__)

PROBE_BURST = 5
"""Inference probes one caller may start at once before its ``--max-probes-per-s`` rate applies."""


class LifecycleService:
    """Health with inference probes, Abort by id, session or all, and Drain."""

    def __init__(
        self,
        engines: EngineSet,
        registry: RequestRegistry,
        state: GatewayState,
        *,
        probe_timeout: float = 30.0,
        probes_per_s: float = 1.0,
        drain_progress_interval: float = 0.5,
        bounds: FieldBounds = DEFAULT_BOUNDS,
    ) -> None:
        self._engines = engines
        self._registry = registry
        self._state = state
        self._probe_timeout = probe_timeout
        self._probe_rate = RateLimit("inference probes", "--max-probes-per-s", probes_per_s, PROBE_BURST)
        self._bounds = bounds
        self._progress_interval = drain_progress_interval
        self._closed: EngineFailure | None = None
        """Set at shutdown: open drains end with it (``close``)."""

    def close(self, reason: str) -> None:
        """Shutdown: every open Drain ends with one terminal error within a progress interval,
        not with the transport's UNAVAILABLE when the server stops."""
        self._closed = EngineFailure(pb.ERROR_CODE_DRAINING, reason, retryable=True, retry_after_ms=1000)

    # -- Health ---------------------------------------------------------------------------

    async def health(self, request: pb.HealthRequest) -> pb.HealthResponse:
        """Readiness from the gateway and each engine; optionally a real inference probe.

        ``model`` and ``role`` belong to the probe (the contract: "used when
        include_inference_probe is true"): with it they select the engine probed and checked
        and add its role check; without it every engine is checked and both are ignored.
        """
        if request.role not in pb.EngineRole.values():
            raise InvalidArgument(f"unknown role {request.role}")
        probe = request.include_inference_probe
        selected = list(self._engines.route(request.model).engines) if probe and request.model else list(self._engines)
        if not self._state.started:
            return pb.HealthResponse(
                state=pb.HEALTH_STATE_STARTING,
                checks=[pb.HealthCheck(name="grpc", state=pb.HEALTH_STATE_STARTING, message="starting")],
            )
        checks = [pb.HealthCheck(name="grpc", state=pb.HEALTH_STATE_READY, message="serving")]
        # Side by side: a Health answers within one check's timeout however many engines hang.
        for engine, reported in zip(selected, await asyncio.gather(*map(engine_checks, selected)), strict=True):
            checks.extend(health_message(check, self._prefix(engine)) for check in reported)
            fault = engine.faults.latest
            if fault is not None:  # a driver's recent mistake at request time (core.driver_faults)
                message = self._prefix(engine) + fault
                checks.append(pb.HealthCheck(name="driver", state=pb.HEALTH_STATE_NOT_READY, message=message))
        if probe:  # the named model's engines (every engine of a split), else the first engine
            probed = selected if request.model else selected[:1]
            if request.role != pb.ENGINE_ROLE_UNSPECIFIED:
                roles = [_role_check(engine, request.role, self._prefix(engine)) for engine in probed]
                checks.append(_one_check(roles))
            checks.append(_one_check(await self._probes(probed, request.model)))
        if self._state.draining:
            return pb.HealthResponse(state=pb.HEALTH_STATE_DRAINING, checks=checks)
        return pb.HealthResponse(state=worst([c.state for c in checks]), checks=checks)

    async def _probes(self, probed: list[Engine], model: str) -> list[pb.HealthCheck]:
        """Probe each engine, admitted as one request of its caller (it holds a ``--max-in-flight`` slot, the
        caller's per-token one and passes the memory budget) and within the caller's probe rate."""
        caller = current_caller()
        self._probe_rate.take(caller)
        active = ActiveRequest(request_id=f"probe-{uuid.uuid4().hex}", kind="probe", model=model, owner=caller.name)
        self._registry.admit(active)
        try:
            return list(await asyncio.gather(*(self._probe_check(engine, self._prefix(engine)) for engine in probed)))
        finally:
            self._registry.release(active, finished=False)

    def _prefix(self, engine: Engine) -> str:
        """What tells one engine's check messages from another's behind a shared endpoint."""
        return f"{engine.served_name}: " if len(self._engines) > 1 else ""

    async def _probe_check(self, engine: Engine, prefix: str) -> pb.HealthCheck:
        try:
            async with asyncio.timeout(self._probe_timeout):  # not wait_for: on 3.11 it can swallow a cancel
                message = await self.probe(engine)
            return pb.HealthCheck(name="inference_probe", state=pb.HEALTH_STATE_READY, message=prefix + message)
        except TimeoutError:
            text = f"no result within {self._probe_timeout:g}s"
        except Exception as exc:  # broad on purpose: any probe failure is a NOT_READY check
            text = as_failure(exc).message
        return pb.HealthCheck(name="inference_probe", state=pb.HEALTH_STATE_NOT_READY, message=prefix + text)

    async def probe(self, engine: Engine) -> str:
        """A minimal real inference fitting the engine's role; returns what it observed.

        A driver with a probe of its own (``Backend.inference_probe``, a proxy's remote) runs
        that. Otherwise aggregated and decode engines generate one token; a prefill engine
        prefills a short prompt and its KV session is released right away. An engine that
        advertises no generation but Embed or Classify (a pooling model) embeds or classifies
        one input.
        """
        own = await engine.backend.inference_probe()
        if own is not None:
            return own
        request_id = f"probe-{uuid.uuid4().hex}"
        model = engine.model_info
        if not model.HasField("generation") and model.HasField("tasks"):
            for task in ("embed", "classify"):
                caps = getattr(model.tasks, task)
                if caps.HasField("supported") and caps.supported:
                    return await _task_probe(engine, task, caps, request_id)
        text_ok = not model.HasField("supports_text_input") or model.supports_text_input
        request = GenerationRequest(
            request_id=request_id,
            model=engine.served_name,
            prompt="Hello" if text_ok else None,
            prompt_token_ids=None if text_ok else [0],
            stopping=Stopping(max_tokens=1),
        )
        events = open_stream(engine.backend, engine.faults, request)
        done = False
        try:
            async for event in events:
                if isinstance(event, PrefillDone):
                    await engine.backend.abort_kv_session(event.session.session_id)
                    done = True
                    return "prefill produced a KV session"
                if isinstance(event, OutputFinished):
                    done = True
                    return "generated a token"
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, "the probe ended without a result")
        finally:
            events.detach()
            if not done:
                await engine.backend.abort(request_id)

    # -- Abort ----------------------------------------------------------------------------

    async def abort(self, request: pb.AbortRequest) -> pb.AbortResponse:
        """Abort one request, the requests and KV state of one session, or everything."""
        check_abort_fields(request, self._bounds)
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument("exactly one abort target is required (request_id, kv_session or all_requests)")
        if not any(engine.facts.supports_abort for engine in self._engines):
            names = ", ".join(sorted({engine.facts.engine_name for engine in self._engines}))
            raise Unimplemented(f"the {names} engine does not support abort")
        if target == "request_id":
            return self._abort_request(request.request_id)
        if target == "kv_session":
            return await self._abort_session(request.kv_session.session_id)
        aborted = await self.abort_all_requests("aborted by Abort(all_requests)")
        audit(f"Abort(all_requests) of {aborted} requests")
        return pb.AbortResponse(status=pb.ABORT_STATUS_ABORTED, message=f"aborted {aborted} requests")

    def _abort_request(self, request_id: str) -> pb.AbortResponse:
        """Abort one request the caller reaches; another caller's is answered as an unknown id."""
        if not request_id:
            raise InvalidArgument("abort request_id must be non-empty")
        caller = current_caller()
        active = self._registry.find(request_id, caller)
        if active is not None and not active.ended:
            engine = self._engines.engine(active.model)
            if not engine.facts.supports_abort:
                raise Unimplemented(f"the {engine.facts.engine_name} engine does not support abort")
            active.abort("aborted by Abort")
            return pb.AbortResponse(status=pb.ABORT_STATUS_ABORTED, message=f"request {clip(request_id)} aborted")
        if active is not None or self._registry.finished(request_id, caller):
            return pb.AbortResponse(
                status=pb.ABORT_STATUS_ALREADY_FINISHED, message=f"request {clip(request_id)} already finished"
            )
        raise NotFound(f"no request {clip(request_id)} is in flight or recently finished")

    async def _abort_session(self, session_id: str) -> pb.AbortResponse:
        """Abort a KV session the caller reaches: one it was handed, or one its requests use.

        A caller that does not see every client's requests never makes an engine release a
        session it cannot show is its own, and is answered as for an unknown session."""
        if not session_id:
            raise InvalidArgument("abort kv_session.session_id must be non-empty")
        caller = current_caller()
        registry = self._registry
        attached = [active for active in registry.with_kv_session(session_id) if caller.reaches(active.owner)]
        if not caller.sees_all and not attached and not registry.knows_session(session_id, caller.reaches):
            raise NotFound(f"no KV session {clip(session_id)} is open")
        for active in attached:
            active.abort(f"KV session {clip(session_id)} aborted")
        released = False
        for engine in self._engines:
            released = await engine.backend.abort_kv_session(session_id) or released
        if not attached and not released:
            if registry.knows_session(session_id, caller.reaches):
                return pb.AbortResponse(
                    status=pb.ABORT_STATUS_ALREADY_FINISHED,
                    message=f"KV session {clip(session_id)} holds nothing an Abort can release (pulled, expired, "
                    "released, or freed by its engine alone)",
                )
            raise NotFound(f"no KV session {clip(session_id)} is open")
        registry.remember_session(session_id, caller.name)
        return pb.AbortResponse(
            status=pb.ABORT_STATUS_ABORTED,
            message=f"KV session {clip(session_id)} aborted ({len(attached)} attached requests)",
        )

    async def abort_all_requests(self, reason: str) -> int:
        """Abort every request in flight (``Abort(all_requests)``); how many."""
        return self._abort_all(reason)

    def _abort_all(self, reason: str) -> int:
        in_flight = [active for active in self._registry.in_flight() if not active.ended]
        for active in in_flight:
            active.abort(reason)
        return len(in_flight)

    # -- Drain ----------------------------------------------------------------------------

    async def drain(self, request: pb.DrainRequest) -> AsyncIterator[pb.DrainResponse]:
        """STARTED, IN_PROGRESS on every change, then COMPLETE (or one terminal error)."""
        loop = asyncio.get_running_loop()
        audit(
            f"Drain (stop accepting: {request.stop_accepting_new_requests}, abort after deadline: "
            f"{request.abort_after_deadline})"
        )
        if request.stop_accepting_new_requests:
            self._state.draining = True
        deadline = loop.time() + request.deadline_ms / 1000 if request.HasField("deadline_ms") else None
        counts = await self._counts()
        yield drain_response(pb.DRAIN_STATE_STARTED, counts, "drain started")
        reported = counts
        try:
            aborted = False
            while True:
                seen = self._registry.version  # before reading: a change from here on ends the wait below
                counts = await self._counts()
                in_flight, sessions = counts
                if in_flight == 0 and not sessions:
                    yield drain_response(pb.DRAIN_STATE_COMPLETE, counts, "drained")
                    return
                if self._closed is not None:
                    yield pb.DrainResponse(error=self._closed.to_proto())
                    return
                if counts != reported:
                    yield drain_response(pb.DRAIN_STATE_IN_PROGRESS, counts, "draining")
                    reported = counts
                now = loop.time()
                if deadline is not None and now >= deadline and not aborted:
                    if not request.abort_after_deadline:
                        details = {"in_flight_requests": in_flight}
                        open_text = f"{in_flight} requests"
                        if sessions is not None:  # absent where unknown, as in the progress counts
                            details["open_kv_sessions"] = sessions
                            open_text += f" and {sessions} KV sessions"
                        failure = EngineFailure(
                            pb.ERROR_CODE_DRAINING,
                            f"drain deadline passed with {open_text} open",
                            retryable=True,
                            retry_after_ms=0,
                            details=details,
                        )
                        yield pb.DrainResponse(error=failure.to_proto())
                        return
                    self._abort_all("aborted by Drain after its deadline")
                    for engine in self._engines:
                        await engine.backend.abort_all_kv_sessions()
                    aborted = True
                wait = self._progress_interval
                if deadline is not None and not aborted:
                    wait = min(wait, max(deadline - now, 0.0))
                await self._registry.wait_changed(wait, since=seen)
        except Exception as exc:  # broad on purpose: after STARTED, a failure is one terminal EngineError
            log.exception("drain failed after it started")
            yield pb.DrainResponse(error=as_failure(exc).to_proto())

    async def _counts(self) -> tuple[int, int | None]:
        """In-flight requests, and open KV sessions (None when no engine reports them)."""
        sessions: int | None = None
        for engine in self._engines:
            load = await engine.backend.load()
            if load.active_kv_sessions is not None:
                sessions = (sessions or 0) + load.active_kv_sessions
        return len(self._registry), sessions


async def _task_probe(
    engine: Engine, task: str, caps: pb.EmbedCapabilities | pb.ClassifyCapabilities, request_id: str
) -> str:
    """Embed or classify one short input, in the input type the task accepts."""
    text = pb.TASK_INPUT_TYPE_TEXT in caps.input_types
    item = TaskItem("probe", text="Hello") if text else TaskItem("probe", token_ids=[0])
    context = TaskContext(request_id, engine.served_name)
    try:
        if task == "embed":
            await engine.backend.embed(EmbedCall(context, (item,)))
            return "embedded an input"
        await engine.backend.classify(ClassifyCall(context, (item,)))
        return "classified an input"
    except BaseException:
        await engine.backend.abort(request_id)
        raise


def _one_check(checks: Sequence[pb.HealthCheck]) -> pb.HealthCheck:
    """The one check of its name for a model: a split's engines are probed each, and reported as
    the contract's single ``inference_probe`` (or ``role``) check of the model asked about, in the
    worst engine's state, its message naming every engine's."""
    if len(checks) == 1:
        return checks[0]
    state = worst([check.state for check in checks])
    return pb.HealthCheck(name=checks[0].name, state=state, message="; ".join(check.message for check in checks))


def _role_check(engine: Engine, expected: pb.EngineRole.ValueType, prefix: str) -> pb.HealthCheck:
    if engine.role == expected:
        return pb.HealthCheck(name="role", state=pb.HEALTH_STATE_READY, message=f"{prefix}role matches")
    return pb.HealthCheck(
        name="role",
        state=pb.HEALTH_STATE_NOT_READY,
        message=f"{prefix}engine role is {pb.EngineRole.Name(engine.role)}, expected {pb.EngineRole.Name(expected)}",
    )


def drain_response(state: pb.DrainState.ValueType, counts: tuple[int, int | None], message: str) -> pb.DrainResponse:
    """A Drain progress message with its counts: in-flight requests, and open KV sessions (None: unknown)."""
    in_flight, sessions = counts
    response = pb.DrainResponse(state=state, in_flight_requests=in_flight, message=message)
    if sessions is not None:
        response.open_kv_sessions = sessions
    return response


__all__ = ["LifecycleService", "drain_response"]
