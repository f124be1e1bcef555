"""``VllmBackend``: vLLM's ``AsyncLLM`` in process, behind the OpenEngine SPI.

The class starts, describes and stops the engine and holds its state; what it does per call lives
beside it: ``generation`` (one Generate), ``tasks`` (Embed, Classify, Score), ``loras``,
``kv_publishers``, with ``startup`` (how the engine is built) and ``failures`` (vLLM's exceptions as
the contract's). Those modules import vLLM inside their functions, when an engine runs (``import
vllm`` takes seconds), so loading the plugin, validating settings and the mapping tests need no
vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, ClassVar

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, FailedPrecondition, Unavailable
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    Classification,
    ClassifyCall,
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
    ScoreCall,
    ScoreResult,
    SharedEngine,
    TaskUsage,
)

from . import capabilities, generation, kv_publishers, mapping, startup, tasks
from .loras import VllmAdapters
from .outputs import RequestStream
from .pooling import PoolingEngine, task_capabilities
from .settings import VllmSettings
from .sharing import VllmAttachment, unix_nanos
from .shutdown import shut_down

log = logging.getLogger(__name__)


class VllmBackend(Backend[VllmSettings]):
    """vLLM's ``AsyncLLM`` serving one model (``--backend vllm --model PATH_OR_ID``)."""

    name: ClassVar[str] = capabilities.ENGINE_NAME
    Settings: ClassVar[type[BackendSettings]] = VllmSettings

    def __init__(self, settings: VllmSettings) -> None:
        super().__init__(settings)
        self._engine: Any = None
        self._limits = mapping.EngineLimits(max_model_len=1, vocab_size=1, max_logprobs=0)
        self._features: capabilities.EngineFeatures | None = None
        self._stats: dict[int, Any] = {}
        self._stamps: dict[int, float] = {}
        """Per engine core, when it made the stats in ``_stats`` (attached to a shared core only)."""
        self._stats_enabled = False
        self._loras = VllmAdapters()
        self._pooling: PoolingEngine | None = None
        self._dp_rank = 0
        self._sockets: tempfile.TemporaryDirectory[str] | None = None
        """vLLM's socket files, removed at ``stop`` (None: vLLM's own base path, left as vLLM leaves it)."""
        self._attachment: VllmAttachment | None = None
        """The supervisor's engine core this frontend joins (``--frontends``), or None: start one."""

    # -- several frontend processes (spi.frontends) ----------------------------------------

    @classmethod
    def share(cls, settings: BackendSettings, frontends: int) -> SharedEngine:
        """vLLM's engine core started once for ``frontends`` gateway processes (``sharing``)."""
        from .sharing import VllmSharedEngine

        assert isinstance(settings, VllmSettings)
        return VllmSharedEngine(settings, frontends)

    def attach(self, attachment: object) -> None:
        """Join the supervisor's engine core at ``start`` (``attachment``: a ``VllmAttachment``)."""
        if not isinstance(attachment, VllmAttachment):
            raise TypeError(f"a vLLM frontend attaches with a VllmAttachment, not {type(attachment).__name__}")
        self._attachment = attachment

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Build ``AsyncLLM`` from the settings (in a thread: it blocks while the core starts)."""
        settings = self.settings
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM

        startup.environment_cached(False)  # this start reads what is set now (VLLM_RPC_BASE_PATH below)
        args = startup.engine_args(settings)
        self._stats_enabled = not args.disable_log_stats
        ours = startup.stats_logger(self._stats)
        if self._attachment is not None:
            from .sharing import attached_engine, stamp_stats

            self._engine = await asyncio.to_thread(attached_engine, args, self._attachment, ours)
            stamp_stats(self._engine, self._stamps)
            # vLLM sends a step's stats, and the one after an abort, to any of its API servers: read them from
            # now on, not from this frontend's first request (an unread sibling also keeps the others' stale).
            self._engine._run_output_handler()
            return await self._started(vllm.__version__, ours)
        self._sockets = startup.socket_directory()
        try:
            with startup.rpc_base_path(self._sockets.name) if self._sockets is not None else contextlib.nullcontext():
                self._engine = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[ours])
        except BaseException:
            if self._sockets is not None:
                self._sockets.cleanup()
            raise
        return await self._started(vllm.__version__, ours)

    async def _started(self, version: str, stat_logger: type) -> EngineFacts:
        startup.keep_only_stat_logger(self._engine, stat_logger)
        startup.environment_cached(True)
        try:
            return await self._describe(version)
        except BaseException:
            await self.stop()
            raise

    async def _describe(self, version: str) -> EngineFacts:
        import vllm.envs
        from vllm.platforms import current_platform

        engine = self._engine
        config = engine.vllm_config
        model_config = config.model_config
        supported = tuple(await engine.get_supported_tasks())
        tokenizer = engine.tokenizer
        features = capabilities.EngineFeatures(
            supported_tasks=supported,
            vocab_size=model_config.get_vocab_size(),
            has_tokenizer=tokenizer is not None,
            structured_outputs=current_platform.supports_structured_output(),
            token_id_logprobs=bool(config.use_v2_model_runner),
            max_num_sequences=vllm.envs.VLLM_MAX_N_SEQUENCES,
            engines=len(getattr(engine.engine_core, "engine_ranks_managed", ())) or 1,
            lora_prompt_logprobs=not current_platform.is_cpu(),
        )
        self._features = features
        role = capabilities.engine_role(config)
        transfer = config.kv_transfer_config
        self._dp_rank = config.parallel_config.data_parallel_rank
        generation_config = model_config.try_get_generation_config()
        diff_sampling = model_config.get_diff_sampling_param()
        self._limits = mapping.EngineLimits(
            max_model_len=model_config.max_model_len,
            vocab_size=features.vocab_size,
            max_logprobs=capabilities.resolved_max_logprobs(model_config.max_logprobs, features.vocab_size),
            eos_token_ids=mapping.eos_token_ids(engine.renderer.get_eos_token_id(), generation_config),
            sampling_defaults=mapping.sampling_defaults(diff_sampling),
            default_max_tokens=diff_sampling.get("max_tokens"),
            priority_scheduling=config.scheduler_config.policy == "priority",
            guided_backend=capabilities.guided_backend(config, features),
            token_id_logprobs=features.token_id_logprobs,
            role=role,
            transfer_backend=transfer.kv_connector if transfer is not None and transfer.kv_connector else "",
        )
        info = capabilities.model_info(config, features)
        self._pooling = tasks.pooling_engine(engine, config, features)
        task_table = task_capabilities(self._pooling.model) if self._pooling is not None else None
        if task_table is not None:
            info.tasks.CopyFrom(task_table)
        published = engine.get_kv_event_sources()
        kv_sources = capabilities.subscribable(config, published)
        if published and not kv_sources:
            log.warning(
                "vLLM publishes KV events to %s, which it connects to: they go to the subscriber bound there, "
                "not through this gateway (give vLLM a tcp://*:PORT or ipc:// endpoint to serve them)",
                config.kv_events_config.endpoint,
            )
        return EngineFacts(
            engine_name=capabilities.ENGINE_NAME,
            engine_version=version,
            model=info,
            role=role,
            parallelism=capabilities.parallelism(config),
            kv_connector=capabilities.kv_connector(config),
            publishes_kv_events=bool(kv_sources),
            tokenizer_id=await asyncio.to_thread(startup.tokenizer_id, tokenizer),
        )

    async def stop(self) -> None:
        """Shut the engine core down (its processes, sockets and their files).

        vLLM's output loop is stopped first, so it does not report the core's exit as a failure.
        """
        if self._engine is not None:
            engine, self._engine = self._engine, None
            if engine.output_handler is not None:
                engine.output_handler.cancel()
            await asyncio.to_thread(shut_down, engine)
        if self._sockets is not None:
            self._sockets.cleanup()

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> EventStream:
        """Validate against the started engine (tokenizing text prompts), then stream."""
        if self._running().errored:
            raise Unavailable("the vLLM engine core died; restart this gateway", retry_after_ms=1000)
        features = self._features
        assert features is not None
        if "generate" not in features.supported_tasks:
            raise FailedPrecondition("this vLLM engine runs the pooling runner: it serves Embed, Classify and Score")
        lora = self._loras.find(request.lora_name)
        prompt: dict[str, Any] = mapping.prompt_input(request)
        prompt_len: int | None = None
        if not request.media:
            prompt = generation.render(self._engine, prompt)
            prompt_len = len(prompt["prompt_token_ids"])
        plan = mapping.plan_generation(request, self._limits, prompt_len=prompt_len)
        params = generation.sampling_params(self._engine, plan)
        stream = RequestStream(
            request,
            eos_token_ids=self._limits.eos_token_ids,
            prefill=self._limits.role == pb.ENGINE_ROLE_PREFILL,
            transfer_backend=self._limits.transfer_backend,
            dp_rank=request.data_parallel_rank if request.data_parallel_rank is not None else self._dp_rank,
            token_text=partial(generation.token_text, self._engine) if request.prompt_logprobs is not None else None,
        )
        return EventStream.from_iterator(
            generation.stream_outputs(self._engine, request, prompt, params, plan, lora, stream)
        )

    async def abort(self, request_id: str) -> None:
        """Abort in vLLM by the request id (and every item of a task call)."""
        if self._engine is None:
            return
        ids = self._pooling.item_ids(request_id) if self._pooling is not None else [request_id]
        await self._engine.abort(ids or [request_id])

    # -- tasks ----------------------------------------------------------------------------

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        """Embeddings through vLLM's pooling runner."""
        return await tasks.pooled(self._pooler().embed(call, self._loras.find(call.context.lora_name)))

    async def classify(self, call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        """Class scores through vLLM's pooling runner."""
        return await tasks.pooled(self._pooler().classify(call, self._loras.find(call.context.lora_name)))

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """Pair scores (pooling runner) or label-token scores (generate runner)."""
        return await tasks.pooled(self._pooler().score(call, self._loras.find(call.context.lora_name)))

    def _pooler(self) -> PoolingEngine:
        if self._pooling is None:
            raise FailedPrecondition("this vLLM engine serves no Embed, Classify or Score task")
        return self._pooling

    # -- LoRA -----------------------------------------------------------------------------

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """``AsyncLLM.add_lora``; the gateway's registry owns names and ids."""
        await self._loras.load(self._running(), adapter)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """``AsyncLLM.remove_lora`` by the adapter's id."""
        await self._loras.unload(self._running(), adapter)

    # -- health, load, KV events ----------------------------------------------------------

    async def check_health(self) -> list[HealthCheck]:
        """vLLM's own health check (a dead engine core or output loop is NOT_READY)."""
        engine = self._engine
        if engine is None:
            return [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, "engine stopped")]
        try:
            await engine.check_health()
        except Exception as exc:  # broad on purpose: any failure is a NOT_READY check
            return [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, f"vLLM: {exc!r}")]
        return [HealthCheck("model", pb.HEALTH_STATE_READY, "vLLM engine core running")]

    async def load(self) -> Load:
        """Running, waiting and KV usage per data-parallel rank from vLLM's scheduler stats.

        Nothing is known (every field absent) without stats, and once the engine core died: its
        last stats describe requests that no longer run."""
        if self._engine is None or self._engine.errored or not self._stats_enabled or self._features is None:
            return Load()
        config = self._engine.vllm_config
        ranks = list(getattr(self._engine.engine_core, "engine_ranks_managed", ())) or [self._dp_rank]
        blocks = capabilities.blocks_per_rank(config, self._features)
        load = capabilities.load_info(self._stats, blocks=blocks, ranks=ranks)
        if not self._stamps:
            return load
        # Beside other frontends, this one's stats are as old as the engine made them (``sharing``).
        return dataclasses.replace(load, timestamp_unix_nanos=unix_nanos(max(self._stamps.values())))

    def kv_event_sources(self) -> list[KvEventSource]:
        """vLLM's ZMQ KV-event publishers, one per data-parallel rank."""
        return kv_publishers.event_sources(self._running())

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """vLLM's published KV events, decoded into batches (vLLM's sequence numbers kept), with
        skipped batches replayed from vLLM's replay socket when it has one."""
        return kv_publishers.event_batches(self._running())

    def _running(self) -> Any:
        if self._engine is None:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, "the vLLM engine is not running")
        return self._engine


__all__ = ["VllmBackend"]
