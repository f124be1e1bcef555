"""Embed, Classify and Score: unary task calls with the shared request-id namespace.

Each call is validated before acceptance, registered under its request id (so ``Abort``
and duplicates behave exactly as for Generate), run on its own task (so ``Abort`` can stop
it and the call answers CANCELLED), and its result checked against the contract before it
is returned. Unary calls have no error event: every failure is a non-OK status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from .. import pb
from ..contract import tasks as rules
from ..contract.bounds import DEFAULT_BOUNDS, FieldBounds, check_task_fields
from ..contract.limits import RequestLimits, check_task_count, check_task_inputs, score_inputs
from ..contract.stream import ContractViolation
from ..engines import Engine, EngineSet
from ..errors import Cancelled, EngineFailure, Internal, RequestError, Unavailable, as_status_error, clip
from ..logs import bind_request_id
from ..spi.requests import ClassifyCall, EmbedCall, ScoreCall, TaskContext
from ..spi.results import Classification, Embedding, ScoreResult, TaskUsage
from .aborts import abort_then_release
from .background import BackgroundTasks
from .callers import current_caller, scoped_id
from .driver_faults import escaped, kind
from .lora import LoraRegistry
from .registry import ActiveRequest, RequestRegistry
from .results import classify_messages, embed_messages, score_messages
from .state import GatewayState
from .telemetry import OK, REJECTED, Telemetry, outcome

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C", EmbedCall, ClassifyCall, ScoreCall)


class TaskService:
    """Runs the non-generative task RPCs."""

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
    ) -> None:
        self._engines = engines
        self._registry = registry
        self._state = state
        self._loras = loras
        self._background = background
        self._limits = limits or RequestLimits()
        self._bounds = bounds
        self._telemetry = telemetry

    def _route(
        self,
        request: pb.EmbedRequest | pb.ClassifyRequest | pb.ScoreRequest,
        inputs: Iterable[pb.TaskInput],
        parse: Callable[[pb.ModelInfo], C],
    ) -> tuple[Engine, str, C]:
        """The engine, its split label (``Route.split_of``) and the parsed call, checked in order: an
        unknown model (NOT_FOUND), the operator's caps on each input (RESOURCE_EXHAUSTED, before parsing
        looks at what they hold), what the model advertises (INVALID_ARGUMENT past an advertised limit, which
        ``--max-task-items`` narrows), the operator's cap on the count, then the engine's readiness.
        The bounds on identifiers and metadata come first of all."""
        context = request.context
        rules.require_context(context)
        self._state.check_accepting()
        check_task_fields(request, self._bounds)
        route = self._engines.route(context.model, required=True)
        count = check_task_inputs(inputs, self._limits)
        call = parse(route.model_info)
        route.check_token_ids(request)
        engine = route.pick(metadata=context.metadata, down=self._state.engines_down)
        check_task_count(count, self._limits)
        self._state.check_engine(engine.served_name)
        scoped = scoped_id(current_caller().name, call.context.request_id)  # what the engine knows
        call = dataclasses.replace(call, context=dataclasses.replace(call.context, request_id=scoped))
        return engine, route.split_of(engine), call

    async def embed(self, request: pb.EmbedRequest) -> pb.EmbedResponse:
        """Embeddings for every input, in order."""
        engine, split, call = self._route(request, request.inputs, lambda info: rules.parse_embed(request, info))
        answer = await self._run(engine, split, call.context, "embed", lambda: engine.backend.embed(call))
        outputs, usage = embed_messages(answer)  # the gateway's own code from here: its bug stays INTERNAL
        response = _assembled(
            engine, "embed", lambda: rules.finish_embed(call, outputs, usage, engine.model_info.tasks.embed)
        )
        response.request_id = request.context.request_id  # as the client sent it
        return response

    async def classify(self, request: pb.ClassifyRequest) -> pb.ClassifyResponse:
        """Class scores for every input, in order."""
        engine, split, call = self._route(request, request.inputs, lambda info: rules.parse_classify(request, info))
        answer = await self._run(engine, split, call.context, "classify", lambda: engine.backend.classify(call))
        outputs, usage = classify_messages(answer)  # the gateway's own code from here: its bug stays INTERNAL
        response = _assembled(
            engine, "classify", lambda: rules.finish_classify(call, outputs, usage, engine.model_info.tasks.classify)
        )
        response.request_id = request.context.request_id  # as the client sent it
        return response

    async def score(self, request: pb.ScoreRequest) -> pb.ScoreResponse:
        """Scores for every candidate of every group, in order."""
        engine, split, call = self._route(request, score_inputs(request), lambda info: rules.parse_score(request, info))
        answer = await self._run(engine, split, call.context, "score", lambda: engine.backend.score(call))
        result, usage = score_messages(answer)  # the gateway's own code from here: its bug stays INTERNAL
        response = _assembled(
            engine, "score", lambda: rules.finish_score(call, result, usage, engine.model_info.tasks.score)
        )
        response.request_id = request.context.request_id  # as the client sent it
        return response

    async def _run(
        self, engine: Engine, split: str, context: TaskContext, method: str, start: Callable[[], Awaitable[T]]
    ) -> T:
        """Admit, run the driver's ``method`` call abortably, check its result's types, and turn any failure
        into a status: the driver's mistakes a retryable UNAVAILABLE naming it (``core.driver_faults``).
        Counted under ``engine`` and ``split``."""
        work = _started(start)
        try:
            if context.lora_name is not None:
                self._loras.get(context.lora_name)
            owner = current_caller().name
            client_id = context.request_id.removeprefix(f"{owner}/") if owner is not None else context.request_id
            active = ActiveRequest(context.request_id, "task", engine.served_name, client_id=client_id, owner=owner)
            self._registry.admit(active)
        except BaseException:
            _close(work)
            raise
        bind_request_id(context.request_id)
        task = asyncio.ensure_future(work)
        active.stop = lambda _reason: task.cancel()
        active.on_failure = lambda _failure: task.cancel()
        finished = failed = rejected = False
        code = OK
        try:
            result = _checked(method, await task)
            finished = True
            return result
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is None or not current.cancelling():
                if active.aborted:
                    code = "ABORTED"
                    raise Cancelled(f"request {clip(active.client_id)} was aborted: {active.abort_reason}") from None
                if active.failure is not None:
                    failed = True
                    code = pb.ErrorCode.Name(active.failure.code).removeprefix("ERROR_CODE_")
                    raise Unavailable(active.failure.message, retry_after_ms=active.failure.retry_after_ms) from None
            code = "CANCELLED"
            raise
        except Exception as exc:  # broad on purpose: unary failures must become a status
            failed = True
            rejected = isinstance(exc, RequestError)  # the driver refused it: never accepted, as in Generate
            if not isinstance(exc, RequestError | EngineFailure):
                code = "UNAVAILABLE"
                if isinstance(exc, _WrongResult):
                    raise engine.faults.unavailable(f"{method} {exc}") from None
                raise engine.faults.unavailable(f"{method} raised {escaped(exc)}", exc) from None
            error = as_status_error(exc)
            code = error.status.name
            if isinstance(error, Internal):
                log.error("task %s failed", context.request_id, exc_info=exc)
            raise error from None
        finally:
            active.ended = True
            if finished or rejected:  # nothing runs in the driver: the id is free now
                self._registry.release(active, finished=not rejected)
            else:
                task.cancel()
                abort_then_release(self._background, self._registry, engine, active)
            if self._telemetry is not None:
                ended = REJECTED if rejected else outcome(finished=finished, failed=failed, aborted=active.aborted)
                self._telemetry.stats(engine.served_name, split).ended("task", ended, code)


class _WrongResult(Exception):
    """A driver's task result of the wrong type (says what it returned)."""


_RESULTS: dict[str, tuple[type[object], bool]] = {
    "embed": (Embedding, True),
    "classify": (Classification, True),
    "score": (ScoreResult, False),
}
"""What each task call returns with its ``TaskUsage``: the value type, and whether one per item."""


def _started(start: Callable[[], Awaitable[T]]) -> Awaitable[T]:
    """The driver's call; what it raises, or returns that cannot be awaited, surfaces when awaited."""
    try:
        work = start()
    except Exception as exc:  # broad on purpose: _run tells the driver's refusals from its mistakes
        return _raise(exc)
    if not inspect.isawaitable(work):
        return _raise(_WrongResult(f"returned a {type(work).__name__}, not an awaitable (it must be async def)"))
    return work


async def _raise(exc: Exception) -> Any:
    raise exc


def _checked(method: str, result: T) -> T:
    """``result`` when it is ``method``'s (values, ``TaskUsage``) pair of SPI values; else ``_WrongResult``."""
    value_type, per_item = _RESULTS[method]
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _WrongResult(f"returned a {kind(result)}, not a (result, spi.TaskUsage) pair")
    values, usage = result
    if not isinstance(usage, TaskUsage):
        raise _WrongResult(f"returned a {kind(usage)} as its usage, not an spi.TaskUsage")
    if per_item and (isinstance(values, str | bytes) or not isinstance(values, Sequence)):
        raise _WrongResult(f"returned a {kind(values)}, not a sequence of spi.{value_type.__name__}")
    for value in values if per_item else (values,):
        if not isinstance(value, value_type):
            raise _WrongResult(f"returned a {kind(value)}, not an spi.{value_type.__name__}")
    return result


def _assembled(engine: Engine, method: str, assemble: Callable[[], T]) -> T:
    """The checked response; a contract violation by the driver is its mistake (UNAVAILABLE naming it)."""
    try:
        return assemble()
    except ContractViolation as violation:
        raise engine.faults.unavailable(f"{method} returned a malformed result: {violation}") from None


def _close(work: Awaitable[object]) -> None:
    """Close an un-awaited coroutine so it does not warn."""
    close = getattr(work, "close", None)
    if close is not None:
        close()


__all__ = ["TaskService"]
