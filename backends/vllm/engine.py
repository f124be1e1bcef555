"""``VllmBackend``: vLLM's ``AsyncLLM`` in process, behind the OpenEngine SPI.

With ``engine_args.py`` this is the only module of the driver that imports vLLM, and it does so
when the engine starts (``import vllm`` takes seconds), so loading the plugin, validating
settings and the mapping tests need no vLLM.

Requests are validated against the started engine before acceptance: text prompts are
tokenized by vLLM's own renderer and the ``SamplingParams`` are built and verified in
``generate``, so a request vLLM would refuse is a gRPC status, not a stream error (the price:
tokenization runs on the event loop, where vLLM's server would use a thread). Outputs stream
as vLLM deltas (``RequestOutputKind.DELTA``), mapped by ``outputs.RequestStream``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import zmq
from openengine_gateway import pb
from openengine_gateway.errors import (
    EngineFailure,
    FailedPrecondition,
    InvalidArgument,
    RequestError,
    Unavailable,
)
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    Classification,
    ClassifyCall,
    EmbedCall,
    Embedding,
    EngineFacts,
    EventStream,
    GenerationEvent,
    GenerationRequest,
    HealthCheck,
    KvEventBatch,
    KvEventSource,
    Load,
    LoadedAdapters,
    LoraAdapter,
    Media,
    ScoreCall,
    ScoreResult,
    TaskUsage,
    UsageReport,
    zmq_kv,
)

from . import capabilities, mapping
from .cpu_memory import CPU_KV_CACHE_ENV, cpu_kv_cache_default
from .engine_args import engine_kwargs
from .outputs import RequestStream
from .pooling import PoolingEngine, PoolingModel, task_capabilities
from .settings import VllmSettings
from .shutdown import shut_down

T = TypeVar("T")
log = logging.getLogger(__name__)

_MODALITIES = {pb.MODALITY_IMAGE: "image", pb.MODALITY_VIDEO: "video", pb.MODALITY_AUDIO: "audio"}


def _stats_logger(sink: dict[int, Any]) -> Any:
    """A vLLM stat logger class that keeps each engine's latest ``SchedulerStats`` in ``sink``."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    class LatestSchedulerStats(AggregateStatLoggerBase):  # type: ignore[misc]  # vLLM is Any to mypy (pyproject.toml)
        def __init__(self, vllm_config: Any, engine_indexes: list[int]) -> None:
            del vllm_config, engine_indexes

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                sink[engine_idx] = scheduler_stats

        def log_engine_initialized(self) -> None:
            return None

    return LatestSchedulerStats


def _keep_only_stat_logger(engine: Any, kept: type) -> None:
    """Drop the stat loggers vLLM adds beside ``kept``: its Prometheus logger and its periodic log.

    Nothing reads them here: the gateway serves its own metrics registry, not vLLM's, and never
    calls ``do_log_stats``, which is what prints vLLM's stats log. The Prometheus logger alone cost
    about 4 us of frontend CPU per output token (measured side by side on the tiny Llama).
    """
    manager = getattr(engine, "logger_manager", None)  # None when stats are disabled
    if manager is not None:
        manager.stat_loggers[:] = [logger for logger in manager.stat_loggers if isinstance(logger, kept)]


_SOCKET_NAME_CHARS = 37
"""``/<uuid4>``: what vLLM appends to its RPC base path for each socket."""


def _socket_directory() -> tempfile.TemporaryDirectory[str] | None:
    """A directory of this engine's own for vLLM's socket files, under vLLM's base path; None
    where its longer paths would pass ZeroMQ's limit on IPC paths (vLLM then uses the base)."""
    base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
    if len(os.path.join(base, "oe-vllm-12345678")) + _SOCKET_NAME_CHARS > zmq.IPC_PATH_MAX_LEN:
        log.info("vLLM's socket files stay in %s: a directory of their own there would make their paths too long", base)
        return None
    return tempfile.TemporaryDirectory(prefix="oe-vllm-", dir=base)


@contextlib.contextmanager
def _rpc_base_path(path: str) -> Iterator[None]:
    """Point vLLM's IPC socket files at ``path`` while an engine starts (its processes inherit it).

    vLLM names its ZeroMQ sockets ``$VLLM_RPC_BASE_PATH/<uuid>`` (the temporary directory by
    default) and leaves the files behind when it shuts down: seven a start, in /tmp. Each engine
    here gets a directory of its own, removed when the engine stops.
    """
    previous = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    try:
        yield
    finally:
        if previous is None:
            del os.environ["VLLM_RPC_BASE_PATH"]
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = previous


def _sized_for_cpu(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with a KV cache size on a CPU where the caller gave none (``cpu_memory``):
    vLLM's own default there is 92 % of the machine's RAM."""
    from vllm.platforms import current_platform

    size = cpu_kv_cache_default(options, os.environ) if current_platform.is_cpu() else None
    if size is None:
        return options
    log.info(
        "vLLM on a CPU: KV cache of %d MiB (kv_cache_memory_bytes); set %s (GiB) or kv_cache_memory_bytes to change it",
        size >> 20,
        CPU_KV_CACHE_ENV,
    )
    return {**options, "kv_cache_memory_bytes": size}


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
        self._stats_enabled = False
        self._loras: LoadedAdapters[Any] = LoadedAdapters("the vLLM engine")
        self._pooling: PoolingEngine | None = None
        self._dp_rank = 0
        self._sockets: tempfile.TemporaryDirectory[str] | None = None
        """vLLM's socket files, removed at ``stop`` (None: vLLM's own base path, left as vLLM leaves it)."""

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Build ``AsyncLLM`` from the settings (in a thread: it blocks while the core starts)."""
        settings = self.settings
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=settings.model, **engine_kwargs(_sized_for_cpu(settings.engine_options)))
        self._stats_enabled = not args.disable_log_stats
        ours = _stats_logger(self._stats)
        self._sockets = _socket_directory()
        try:
            with _rpc_base_path(self._sockets.name) if self._sockets is not None else contextlib.nullcontext():
                self._engine = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[ours])
        except BaseException:
            if self._sockets is not None:
                self._sockets.cleanup()
            raise
        _keep_only_stat_logger(self._engine, ours)
        try:
            return await self._describe(vllm.__version__)
        except BaseException:
            await self.stop()
            raise

    async def _describe(self, version: str) -> EngineFacts:
        import vllm.envs
        from vllm.platforms import current_platform

        engine = self._engine
        config = engine.vllm_config
        model_config = config.model_config
        tasks = tuple(await engine.get_supported_tasks())
        tokenizer = engine.tokenizer
        features = capabilities.EngineFeatures(
            supported_tasks=tasks,
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
        self._pooling = self._pooling_engine(config, features)
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
        )

    def _pooling_engine(self, config: Any, features: capabilities.EngineFeatures) -> PoolingEngine | None:
        """The task runner when vLLM runs the pooling runner for this model."""
        from vllm.pooling_params import PoolingParams

        model_config = config.model_config
        if model_config.runner_type != "pooling":
            return None
        pooler = model_config.pooler_config
        id2label = getattr(model_config.hf_config, "id2label", None) or {}
        model = PoolingModel(
            tasks=features.supported_tasks,
            dimension=model_config.embedding_size,
            labels=tuple(str(id2label[key]) for key in sorted(id2label)),
            matryoshka=bool(model_config.is_matryoshka),
            activation_default=pooler is None or pooler.use_activation is not False,
            lora=config.lora_config is not None,
            priority=config.scheduler_config.policy == "priority",
            text=features.has_tokenizer,
        )
        if task_capabilities(model) is None:
            return None
        return PoolingEngine(self._engine, model, PoolingParams)

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
            prompt = self._render(prompt)
            prompt_len = len(prompt["prompt_token_ids"])
        plan = mapping.plan_generation(request, self._limits, prompt_len=prompt_len)
        params = self._sampling_params(plan)
        stream = RequestStream(
            request,
            eos_token_ids=self._limits.eos_token_ids,
            prefill=self._limits.role == pb.ENGINE_ROLE_PREFILL,
            transfer_backend=self._limits.transfer_backend,
            dp_rank=request.data_parallel_rank if request.data_parallel_rank is not None else self._dp_rank,
            token_text=self._token_text if request.prompt_logprobs is not None else None,
        )
        return EventStream.from_iterator(self._run(request, prompt, params, plan, lora, stream))

    def _token_text(self, token_id: int) -> str:
        """One token's text, decoded as vLLM decodes its logprob tokens."""
        from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

        tokenizer = self._engine.tokenizer
        return convert_ids_list_to_tokens(tokenizer, [token_id])[0] if tokenizer is not None else ""

    def _render(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """vLLM's engine input for a text or token prompt: tokenized here, once, before acceptance."""
        from vllm.exceptions import VLLMValidationError

        renderer = self._engine.renderer
        try:
            (engine_input,) = renderer.render_cmpl([prompt])
            renderer.validate_token_ids(engine_input["prompt_token_ids"])
        except (VLLMValidationError, ValueError, TypeError) as exc:
            raise InvalidArgument(f"vLLM rejected the prompt: {exc}") from None
        result: dict[str, Any] = engine_input
        return result

    def _sampling_params(self, plan: mapping.GenerationPlan) -> Any:
        """``SamplingParams`` (DELTA output), verified against the engine's config."""
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        config = self._engine.vllm_config
        try:
            structured = StructuredOutputsParams(**plan.structured_outputs) if plan.structured_outputs else None
            params = SamplingParams(**plan.sampling, structured_outputs=structured, output_kind=RequestOutputKind.DELTA)
            params.verify(
                config.model_config, config.speculative_config, config.structured_outputs_config, self._engine.tokenizer
            )
        except (VLLMValidationError, ValueError) as exc:
            raise InvalidArgument(f"vLLM rejected the request: {exc}") from None
        return params

    async def _run(
        self,
        request: GenerationRequest,
        prompt: dict[str, Any],
        params: Any,
        plan: mapping.GenerationPlan,
        lora: Any,
        stream: RequestStream,
    ) -> AsyncIterator[GenerationEvent]:
        if not request.media:  # rendered here: a request ended before vLLM's first output still counts it
            yield UsageReport(prompt_tokens=len(prompt["prompt_token_ids"]), completion_tokens=0)
        else:
            prompt = {**prompt, **await self._media(request.media)}
        outputs = self._engine.generate(
            prompt,
            params,
            request.request_id,
            lora_request=lora,
            priority=plan.priority,
            data_parallel_rank=request.data_parallel_rank,
        )
        try:
            async for output in outputs:
                try:
                    events = stream.events(output)
                except EngineFailure:
                    yield stream.usage(output)  # the terminal error still counts the prompt
                    raise
                for event in events:
                    yield event
        except (EngineFailure, RequestError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # broad on purpose: every vLLM failure becomes one EngineError
            raise engine_failure(exc) from exc
        finally:
            await outputs.aclose()

    async def _media(self, media: tuple[Media, ...]) -> dict[str, Any]:
        """vLLM's ``multi_modal_data``: media fetched and decoded by vLLM's ``MediaConnector``."""
        from vllm.multimodal.media import MediaConnector

        connector = MediaConnector()
        fetch: dict[str, Any] = {
            "image": connector.fetch_image_async,
            "video": connector.fetch_video_async,
            "audio": connector.fetch_audio_async,
        }
        data: dict[str, list[Any]] = {}
        uuids: dict[str, list[str | None]] = {}
        for item in media:
            kind = _MODALITIES[item.modality]
            url = item.url or item.data_uri
            if url is None:
                mime = item.mime_type or f"{kind}/*"
                url = f"data:{mime};base64,{base64.b64encode(item.raw_bytes or b'').decode()}"
            loaded = await fetch[kind](url)
            data.setdefault(kind, []).append(loaded[0] if kind == "video" else loaded)
            uuids.setdefault(kind, []).append(item.uuid or None)
        return {"multi_modal_data": data, "multi_modal_uuids": uuids}

    async def abort(self, request_id: str) -> None:
        """Abort in vLLM by the request id (and every item of a task call)."""
        if self._engine is None:
            return
        ids = self._pooling.item_ids(request_id) if self._pooling is not None else [request_id]
        await self._engine.abort(ids or [request_id])

    # -- tasks ----------------------------------------------------------------------------

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        """Embeddings through vLLM's pooling runner."""
        return await _pooled(self._pooler().embed(call, self._loras.find(call.context.lora_name)))

    async def classify(self, call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        """Class scores through vLLM's pooling runner."""
        return await _pooled(self._pooler().classify(call, self._loras.find(call.context.lora_name)))

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """Pair scores (pooling runner) or label-token scores (generate runner)."""
        return await _pooled(self._pooler().score(call, self._loras.find(call.context.lora_name)))

    def _pooler(self) -> PoolingEngine:
        if self._pooling is None:
            raise FailedPrecondition("this vLLM engine serves no Embed, Classify or Score task")
        return self._pooling

    # -- LoRA -----------------------------------------------------------------------------

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """``AsyncLLM.add_lora``; the gateway's registry owns names and ids."""
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(adapter.lora_name, adapter.lora_id, adapter.source_path)
        try:
            loaded = await self._running().add_lora(lora)
        except Exception as exc:  # broad on purpose: vLLM raises many kinds for a bad adapter
            raise InvalidArgument(f"vLLM could not load adapter {adapter.lora_name!r}: {exc}") from None
        if not loaded:
            raise InvalidArgument(f"vLLM did not load adapter {adapter.lora_name!r}")
        self._loras.add(adapter.lora_name, lora)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """``AsyncLLM.remove_lora`` by the adapter's id."""
        self._loras.remove(adapter.lora_name)
        await self._running().remove_lora(adapter.lora_id)

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
        return capabilities.load_info(self._stats, blocks=blocks, ranks=ranks)

    def kv_event_sources(self) -> list[KvEventSource]:
        """vLLM's ZMQ KV-event publishers, one per data-parallel rank."""
        return capabilities.kv_event_sources(self._sources())

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """vLLM's published KV events, decoded into batches (vLLM's sequence numbers kept), with
        skipped batches replayed from vLLM's replay socket when it has one."""
        sources = self._sources()
        batches = zmq_kv.subscribe({rank: (events.endpoint, events.topic) for rank, events in sources.items()})
        replay = {rank: events.replay_endpoint for rank, events in sources.items() if events.replay_endpoint}
        return zmq_kv.repair_gaps(batches, replay)

    def _sources(self) -> Mapping[int, Any]:
        """vLLM's KV-event publishers this gateway can subscribe to, by data-parallel rank."""
        engine = self._running()
        return capabilities.subscribable(engine.vllm_config, engine.get_kv_event_sources())

    def _running(self) -> Any:
        if self._engine is None:
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, "the vLLM engine is not running")
        return self._engine


async def _pooled(work: Awaitable[T]) -> T:
    """A task call on the pooling runner: vLLM refusing an input (too long, a token outside the
    vocabulary) refuses the call with INVALID_ARGUMENT; any other vLLM failure is an ``EngineFailure``."""
    from vllm.exceptions import VLLMValidationError

    try:
        return await work
    except VLLMValidationError as exc:
        raise InvalidArgument(f"vLLM rejected the input: {exc}") from None
    except (EngineFailure, RequestError, asyncio.CancelledError):
        raise
    except Exception as exc:  # broad on purpose: every other vLLM failure becomes one EngineFailure
        raise engine_failure(exc) from exc


def engine_failure(exc: BaseException) -> EngineFailure:
    """A vLLM exception raised after acceptance as the contract's terminal failure."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    kind = type(exc).__name__
    if isinstance(exc, VLLMValidationError):
        return EngineFailure(pb.ERROR_CODE_INVALID_ARGUMENT, f"vLLM rejected the request: {exc}")
    if isinstance(exc, EngineDeadError):
        return EngineFailure(pb.ERROR_CODE_INTERNAL, "the vLLM engine core died", retryable=True, retry_after_ms=1000)
    if kind in ("QueueOverflowError", "MaxQueuedTokensError"):
        return EngineFailure(pb.ERROR_CODE_OVERLOADED, f"vLLM is full: {exc}", retryable=True, retry_after_ms=100)
    cause = exc.__cause__ or exc
    return EngineFailure(pb.ERROR_CODE_INTERNAL, f"vLLM failed: {type(cause).__name__}: {cause}")


__all__ = ["VllmBackend", "engine_failure"]
