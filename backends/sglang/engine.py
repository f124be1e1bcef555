"""``SglangBackend``: SGLang's offline ``Engine`` in process, behind the OpenEngine SPI.

With ``server_args.py`` this is the only module of the driver that imports SGLang, and it does
so when the engine starts, so loading the plugin, validating settings and the mapping tests need
no SGLang (which needs CUDA).

Requests are validated against the started engine before acceptance: text prompts are tokenized
here with SGLang's own tokenizer (as its tokenizer manager would) so the prompt length is known,
and everything SGLang would refuse is refused by ``mapping``. Each output runs as one SGLang
request whose cumulative stream ``outputs.RequestStream`` turns into deltas; the driver's tasks
feed one ``EventStream``. Requests go in as the ``GenerateReqInput`` that ``Engine.async_generate``
would build, through the same ``TokenizerManager.generate_request`` (``async_generate`` cannot
ask for token texts with logprobs). Closing SGLang's generator makes SGLang abort the request
itself, so cancelling a task is how work stops; ``abort`` also tells SGLang's scheduler directly.

Disaggregation: a prefill request ends its OpenEngine stream with ``PrefillReady`` at admission,
carrying SGLang's bootstrap host, port and room, while ``sessions.PrefillSessions`` keeps the SGLang
prefill running until the decode engine, which SGLang runs concurrently, took the KV.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, TypeVar

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, FailedPrecondition, InvalidArgument, RequestError, Unavailable
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    Classification,
    ClassifyCall,
    ConfigurationError,
    EmbedCall,
    Embedding,
    EngineFacts,
    EventStream,
    GenerationRequest,
    HealthCheck,
    KvEventBatch,
    KvEventSource,
    Load,
    LoraAdapter,
    PrefillDone,
    ScoreCall,
    ScoreResult,
    TaskUsage,
    UsageReport,
)
from openengine_gateway.spi.zmq_kv import subscribe

from . import capabilities, kv_publishers, mapping
from .capabilities import EngineState
from .outputs import RequestStream
from .process import ChildLines, SigquitGuard, contain_exits, gateway_log_level, kept_logging, process_alive
from .sessions import PrefillSessions
from .settings import SglangSettings
from .tasks import TaskRunner, task_capabilities

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_WILDCARDS = ("", "0.0.0.0", "::", "*")


@dataclass
class _InFlight:
    """The SGLang request ids of one OpenEngine request, and the task feeding its stream."""

    rids: Sequence[str]
    task: asyncio.Task[None] | None = None


class SglangBackend(Backend[SglangSettings]):
    """SGLang's ``Engine`` serving one model (``--backend sglang --model PATH``)."""

    name: ClassVar[str] = capabilities.ENGINE_NAME
    Settings: ClassVar[type[BackendSettings]] = SglangSettings
    process_exclusive: ClassVar[str] = (
        "SGLang keeps one configuration per process, and its shutdown kills every child process of the gateway"
    )

    def __init__(self, settings: SglangSettings) -> None:
        super().__init__(settings)
        self._engine: Any = None
        self._state: EngineState | None = None
        self._limits = mapping.EngineLimits(max_context=1, max_prompt=0, vocab_size=1)
        self._tasks: TaskRunner | None = None
        self._generate_request: Any = None
        self._serial = itertools.count(1)
        self._in_flight: dict[str, _InFlight] = {}
        self._sessions = PrefillSessions(self._abort_rid)
        self._bootstrap = ("", 0)
        self._failure: str | None = None
        self._sigquit = SigquitGuard(self._failed)
        self._shutdown: asyncio.Task[None] | None = None

    @property
    def engine(self) -> Any:
        """The running SGLang ``Engine`` (None before ``start`` and after ``stop``)."""
        return self._engine

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Launch SGLang's processes (in a thread: it blocks while the model loads), then describe it."""
        settings = self.settings
        import sglang

        from .server_args import server_kwargs

        kwargs = server_kwargs(settings.model, settings.server_options)
        if kwargs.get("incremental_streaming_output"):
            raise ConfigurationError(
                "sglang: incremental_streaming_output is not supported (the driver reads SGLang's default)"
            )
        kwargs.setdefault("log_level", gateway_log_level())
        self._sigquit.install()  # SGLang's children may fail while it loads
        try:
            with kept_logging(), ChildLines().capture():
                self._engine = await asyncio.to_thread(sglang.Engine, **kwargs)
        except BaseException:
            self._sigquit.remove()
            raise
        try:
            return await self._describe(sglang.__version__)
        except BaseException:
            await self.stop()
            raise

    async def _describe(self, version: str) -> EngineFacts:
        """Read the started engine's facts.

        SGLang's tokenizer manager binds its output loop to the loop that first uses it, and
        installs its SIGTERM and SIGQUIT handlers there (``auto_create_handle_loop``): started here,
        on the gateway's loop, before the gateway puts its own SIGTERM/SIGINT handling back (the
        command does once the engines started); SIGQUIT is the driver's again at once, and
        ``contain_exits`` keeps SGLang's exits (its SIGTERM watchdog, its output loop's crash
        handler) from ending the gateway's process.
        """
        from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput

        manager = self._engine.tokenizer_manager
        self._generate_request = GenerateReqInput
        contain_exits(manager, self._failed)
        manager.auto_create_handle_loop()
        self._sigquit.install()  # in place of the handler that would kill the gateway's process tree
        server = (await manager.get_internal_state())[0]
        state = self._state = capabilities.engine_state(manager, server)
        self._limits = capabilities.engine_limits(state)
        host = str(server.get("host") or "")
        self._bootstrap = (
            socket.gethostname() if host in _WILDCARDS else host,
            int(server.get("disaggregation_bootstrap_port") or 0),
        )
        info = capabilities.model_info(state)
        tasks = task_capabilities(state)
        if tasks is not None:
            info.tasks.CopyFrom(tasks)
            self._tasks = TaskRunner(self._engine, state, self._limits, EmbeddingReqInput, GenerateReqInput)
        return EngineFacts(
            engine_name=capabilities.ENGINE_NAME,
            engine_version=version,
            model=info,
            role=self._limits.role,
            parallelism=capabilities.parallelism(server),
            kv_connector=capabilities.kv_connector(server, self._bootstrap[0]),
            lora_adapters=capabilities.startup_adapters(manager) if capabilities.lora_enabled(server) else (),
            publishes_kv_events=bool(kv_publishers.kv_event_publishers(server)),
        )

    async def stop(self) -> None:
        """Abort everything SGLang still runs, then shut its processes down (once, however often asked)."""
        if self._shutdown is None:
            self._shutdown = asyncio.create_task(self._shut_down())
        await asyncio.shield(self._shutdown)

    async def _shut_down(self) -> None:
        engine, self._engine = self._engine, None
        try:
            if engine is None:
                return
            self._sessions.release_all()
            for running in self._in_flight.values():
                if running.task is not None:
                    running.task.cancel()
            manager = engine.tokenizer_manager
            manager.abort_request(abort_all=True)
            for task in manager.asyncio_tasks:  # SGLang's output loop and SIGTERM watchdog, on the gateway's loop
                task.cancel()
            await asyncio.to_thread(engine.shutdown)
        finally:
            self._sigquit.remove()

    def _failed(self, reason: str) -> None:
        """SGLang signalled that one of its processes failed: NOT_READY from now on, and its remaining
        processes are stopped (what SGLang's own handler does, less killing the gateway)."""
        if self._failure is not None:
            return
        self._failure = reason
        log.error("%s; the engine is stopped and reports NOT_READY until the gateway restarts", reason)
        if self._shutdown is None:
            self._shutdown = asyncio.create_task(self._shut_down())

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> EventStream:
        """Validate against the started engine (tokenizing text prompts), then stream."""
        engine, state = self._running(), self._state
        assert state is not None
        if not state.is_generation:
            raise FailedPrecondition("this SGLang engine serves an embedding model: Embed, Classify or Score")
        input_ids = request.prompt_token_ids
        if request.prompt is not None and not request.media:
            input_ids = mapping.tokenize(engine.tokenizer_manager.tokenizer, request.prompt)
        plan = mapping.plan_generation(request, self._limits, input_ids=input_ids)
        rids = [mapping.request_rid(next(self._serial), request.request_id, i) for i in range(len(plan.outputs))]
        prompt_tokens = None if input_ids is None else len(input_ids)
        stream = EventStream()
        if self._limits.role == pb.ENGINE_ROLE_PREFILL:
            assert prompt_tokens is not None
            self._prefill(request, plan, rids[0], prompt_tokens, stream)
            return stream
        outputs = RequestStream(
            request,
            eos_token_ids=self._limits.eos_token_ids,
            prompt_ids=input_ids,
            reasoning=bool(state.server.get("reasoning_parser")),
            decode=mapping.text_decoder(engine.tokenizer_manager.tokenizer),
        )
        running = self._in_flight[request.request_id] = _InFlight(rids)
        running.task = asyncio.create_task(self._run(request.request_id, running, plan, outputs, stream))
        return stream

    async def _run(
        self,
        request_id: str,
        running: _InFlight,
        plan: mapping.GenerationPlan,
        outputs: RequestStream,
        stream: EventStream,
    ) -> None:
        """Every output's SGLang stream into ``stream``; a failure ends them all."""
        pumps = [asyncio.create_task(self._pump(i, rid, plan, outputs, stream)) for i, rid in enumerate(running.rids)]
        try:
            await asyncio.gather(*pumps)
            stream.finish()
        except asyncio.CancelledError:
            if self._failure is None:
                stream.cancel()
            else:  # the engine failed under it: the caller may retry elsewhere
                stream.fail(EngineFailure(pb.ERROR_CODE_INTERNAL, self._failure, retryable=True))
            raise
        except Exception as exc:  # broad on purpose: every failure becomes the one terminal EngineError
            stream.fail(engine_failure(exc))
        finally:
            for pump in pumps:
                pump.cancel()
            if self._in_flight.get(request_id) is running:
                del self._in_flight[request_id]

    async def _pump(
        self, index: int, rid: str, plan: mapping.GenerationPlan, outputs: RequestStream, stream: EventStream
    ) -> None:
        generator = self._submit({**plan.shared, **plan.outputs[index], "rid": rid})
        try:
            async for out in generator:
                for event in outputs.events(index, out):
                    stream.put(event)
                if outputs.finished(index):
                    break  # closing the stream below makes SGLang abort what it still runs
        finally:
            await generator.aclose()

    def _prefill(
        self,
        request: GenerationRequest,
        plan: mapping.GenerationPlan,
        rid: str,
        prompt_tokens: int,
        stream: EventStream,
    ) -> None:
        """Hand the decode side its bootstrap coordinates now; keep SGLang's prefill running."""
        host, port = self._bootstrap
        session = mapping.prefill_session(
            request.request_id,
            host=host,
            port=port,
            room=random.getrandbits(53),
            limits=self._limits,
            routed_rank=request.data_parallel_rank,
        )
        kwargs = {**plan.shared, **plan.outputs[0], **mapping.prefill_kwargs(session), "rid": rid}
        self._sessions.hold(session.session_id, rid, lambda: self._drain(session.session_id, kwargs))
        stream.put(UsageReport(prompt_tokens=prompt_tokens, completion_tokens=0))
        stream.put(PrefillDone(session))
        stream.finish()

    async def _drain(self, session_id: str, kwargs: dict[str, Any]) -> None:
        """Run one SGLang prefill to its end (the KV sent, or aborted)."""
        generator = self._submit(kwargs)
        try:
            async for out in generator:
                reason = out["meta_info"].get("finish_reason") or {}
                if reason.get("type") == "abort":
                    log.info("KV session %s ended: %s", session_id, reason.get("message"))
        finally:
            await generator.aclose()

    def _submit(self, fields: dict[str, Any]) -> Any:
        """SGLang's stream of one request (what ``Engine.async_generate(stream=True)`` returns)."""
        return self._engine.tokenizer_manager.generate_request(self._generate_request(**fields), None)

    async def abort(self, request_id: str) -> None:
        """Abort every SGLang request of ``request_id`` (its outputs, or a task call's items)."""
        running = self._in_flight.pop(request_id, None)
        if running is None or self._engine is None:
            return
        for rid in running.rids:
            self._abort_rid(rid)
        if running.task is not None:
            running.task.cancel()

    async def abort_kv_session(self, session_id: str) -> bool:
        """Abort the SGLang prefill that holds ``session_id``'s KV for a decode engine."""
        return self._sessions.release(session_id)

    async def abort_all_kv_sessions(self) -> int:
        """Abort every prefill still waiting for its decode engine."""
        return self._sessions.release_all()

    def _abort_rid(self, rid: str) -> None:
        if self._engine is not None:
            self._engine.tokenizer_manager.abort_request(rid)

    # -- tasks ----------------------------------------------------------------------------

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        """Embeddings from SGLang's embedding model."""
        runner, rids = self._task(call.context.request_id, len(call.items))
        return await self._tracked(call.context.request_id, runner.embed(call, rids))

    async def classify(self, call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        """Class scores from SGLang's sequence-classification model."""
        runner, rids = self._task(call.context.request_id, len(call.items))
        return await self._tracked(call.context.request_id, runner.classify(call, rids))

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """Label-token scores (generation models) or cross-encoder scores (classifiers)."""
        count = sum(len(group.candidates) for group in call.groups)
        runner, rids = self._task(call.context.request_id, count)
        return await self._tracked(call.context.request_id, runner.score(call, rids))

    def _task(self, request_id: str, items: int) -> tuple[TaskRunner, list[str]]:
        if self._tasks is None:
            raise FailedPrecondition("this SGLang engine serves no Embed, Classify or Score task")
        rids = [mapping.request_rid(next(self._serial), request_id, i) for i in range(items)]
        self._in_flight[request_id] = _InFlight(rids)
        return self._tasks, rids

    async def _tracked(self, request_id: str, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except (RequestError, EngineFailure, asyncio.CancelledError):
            raise
        except Exception as exc:  # broad on purpose: every SGLang failure becomes the call's status
            raise engine_failure(exc) from None
        finally:
            self._in_flight.pop(request_id, None)

    # -- LoRA -----------------------------------------------------------------------------

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """``Engine.async_load_lora_adapter``; requests then name the adapter as ``lora_path``."""
        self._check_dynamic_lora()
        result = await self._running().async_load_lora_adapter(adapter.lora_name, adapter.source_path)
        if not result.success:
            raise InvalidArgument(f"SGLang could not load adapter {adapter.lora_name!r}: {result.error_message}")

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """``Engine.async_unload_lora_adapter`` (SGLang waits for the requests using it)."""
        self._check_dynamic_lora()
        result = await self._running().async_unload_lora_adapter(adapter.lora_name)
        if not result.success:
            raise FailedPrecondition(f"SGLang could not unload adapter {adapter.lora_name!r}: {result.error_message}")

    def _check_dynamic_lora(self) -> None:
        """SGLang asserts ``dp_size == 1`` when adapters are loaded or unloaded at runtime."""
        if self._limits.dp_size > 1:
            raise FailedPrecondition(
                f"SGLang loads and unloads adapters at runtime only with dp_size 1 (this engine has "
                f"{self._limits.dp_size}); start it with --lora-paths instead"
            )

    # -- health, load, KV events ----------------------------------------------------------

    async def check_health(self) -> list[HealthCheck]:
        """Liveness: no SGLang process reported a failure, and its scheduler and detokenizer processes run.

        A failed child is usually reported by SGLang's SIGQUIT (see ``process``) before it could be
        seen here; a child that died without a report (killed from outside) is found by its pid.
        """
        if self._failure is not None:
            return [HealthCheck("scheduler", pb.HEALTH_STATE_NOT_READY, self._failure)]
        engine = self._engine
        if engine is None:
            return [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, "engine stopped")]
        dead = [pid for pid in engine.get_all_child_pids() if not process_alive(pid)]
        if dead:
            message = f"SGLang processes exited: {dead}"
            return [HealthCheck("scheduler", pb.HEALTH_STATE_NOT_READY, message)]
        return [HealthCheck("scheduler", pb.HEALTH_STATE_READY, "SGLang processes running")]

    async def load(self) -> Load:
        """Running, waiting and KV usage per DP rank from SGLang's load snapshots."""
        if self._engine is None or self._state is None:
            return Load()
        snapshots = await self._engine.tokenizer_manager.get_loads()
        return capabilities.load_info(snapshots, page_size=self._state.page_size, kv_sessions=len(self._sessions))

    def kv_event_sources(self) -> list[KvEventSource]:
        """SGLang's ZMQ KV-event publishers, one per data-parallel rank."""
        self._running()
        assert self._state is not None
        return kv_publishers.kv_event_sources(self._state.server)

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """SGLang's published KV events, decoded into batches (its sequence numbers kept)."""
        self._running()
        assert self._state is not None
        return subscribe(kv_publishers.kv_event_publishers(self._state.server))

    def _running(self) -> Any:
        if self._engine is None:
            raise Unavailable(self._failure or "the SGLang engine is not running")
        return self._engine


def engine_failure(exc: BaseException) -> EngineFailure:
    """An exception from SGLang after acceptance as the contract's failure.

    SGLang's tokenizer manager validates by raising ``ValueError``; a request it aborted with an HTTP
    status other than 400 raises ``fastapi.HTTPException`` (``_handle_abort_finish_reason``), read
    here by its ``status_code`` so that fastapi need not be imported: 503 (its queue is full) and 429
    are the contract's retryable overload, anything else an engine error that says what SGLang said.
    """
    if isinstance(exc, EngineFailure):
        return exc
    if isinstance(exc, ValueError):
        return EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, f"SGLang rejected the request: {exc}")
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        detail = getattr(exc, "detail", None) or exc
        if status in (HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.TOO_MANY_REQUESTS):
            return EngineFailure(pb.ERROR_CODE_OVERLOADED, f"SGLang is overloaded: {detail}", retryable=True)
        if status == HTTPStatus.BAD_REQUEST:
            return EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, f"SGLang rejected the request: {detail}")
        return EngineFailure(pb.ERROR_CODE_INTERNAL, f"SGLang failed (HTTP {status}): {detail}")
    return EngineFailure(pb.ERROR_CODE_INTERNAL, f"SGLang failed: {type(exc).__name__}: {exc}")


__all__ = ["SglangBackend", "engine_failure"]
