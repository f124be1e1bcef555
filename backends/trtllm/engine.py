"""``TrtllmBackend``: TensorRT-LLM's ``LLM`` (PyTorch backend) in process, behind the OpenEngine SPI.

The only module of the driver that imports TensorRT-LLM, and only when an engine starts, so
loading the plugin, validating settings and every mapping test run without it.

Requests are validated and *submitted* before acceptance: text prompts are tokenized here
(the length sizes the output budget), ``SamplingParams`` are built, and ``generate_async``
is called. TensorRT-LLM reports what its worker refuses (``RequestError``) while the result is
read, before any output, so such a refusal is still a gRPC status (``refusals``); what 1.2.1's
worker raises outside that wrapper ends the engine, so the driver checks it first (``mapping``,
``llm_args``).
TensorRT-LLM's request ids are its own: the driver keeps the gateway id → ``RequestOutput``
handle map, aborts through the handle, and turns its cumulative outputs into deltas
(``outputs.RequestStream``). A prefill's stream ends with ``PrefillReady`` at the handoff; its
request may become final only later (TensorRT-LLM's servicer, ``grpc/openengine/streaming.py``,
handles both orders), so the driver keeps reading it in the background rather than aborting it,
which would cancel the KV transfer. The executor alone keeps the KV cache until the decode side
pulls it (nothing the driver holds, or can release).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure, InvalidArgument, RequestError, Unavailable
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    BackgroundTasks,
    ConfigurationError,
    EngineFacts,
    EventStream,
    GenerationEvent,
    GenerationRequest,
    HealthCheck,
    KvEventBatch,
    Load,
    LoraAdapter,
)

from . import capabilities, generation_config, mapping
from .kv_events import KvEventMapper
from .llm_args import llm_kwargs
from .loras import LoraRegistry, check_adapter
from .outputs import RequestStream
from .refusals import is_request_error, refusal
from .settings import TrtllmSettings
from .versions import check_version

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 0.5
"""How long one read of TensorRT-LLM's statistics or KV-event queue waits for an entry."""
IDLE_POLL_S = 0.05
"""Pause between reads of a queue TensorRT-LLM reported empty (it is not re-armed until a request arrives)."""


@dataclass(frozen=True)
class _Api:
    """The TensorRT-LLM classes the driver uses, imported once at start."""

    version: str
    LLM: Any
    SamplingParams: Any
    GuidedDecodingParams: Any
    LoRARequest: Any
    DisaggregatedParams: Any
    SchedulingParams: Any
    Logprob: Any
    max_top_logprobs: int


def _import_api() -> tuple[_Api, frozenset[str]]:
    """TensorRT-LLM's classes and the ``LLM`` argument names (this takes seconds)."""
    import tensorrt_llm
    from tensorrt_llm import LLM, SamplingParams, sampling_params
    from tensorrt_llm.disaggregated_params import DisaggregatedParams
    from tensorrt_llm.executor.request import LoRARequest
    from tensorrt_llm.executor.result import Logprob
    from tensorrt_llm.llmapi import TorchLlmArgs
    from tensorrt_llm.scheduling_params import SchedulingParams

    api = _Api(
        version=tensorrt_llm.__version__,
        LLM=LLM,
        SamplingParams=SamplingParams,
        GuidedDecodingParams=sampling_params.GuidedDecodingParams,
        LoRARequest=LoRARequest,
        DisaggregatedParams=DisaggregatedParams,
        SchedulingParams=SchedulingParams,
        Logprob=Logprob,
        max_top_logprobs=getattr(sampling_params, "MAX_TOP_LOGPROBS", capabilities.DEFAULT_MAX_TOP_LOGPROBS),
    )
    return api, frozenset(TorchLlmArgs.model_fields)


class TrtllmBackend(Backend[TrtllmSettings]):
    """TensorRT-LLM's ``LLM`` serving one model (``--backend trtllm --model PATH_OR_ID``)."""

    name: ClassVar[str] = "trtllm"
    Settings: ClassVar[type[BackendSettings]] = TrtllmSettings

    def __init__(self, settings: TrtllmSettings) -> None:
        super().__init__(settings)
        self._llm: Any = None
        self._api: _Api | None = None
        self._features = capabilities.EngineFeatures()
        self._handles: dict[str, Any] = {}
        self._loras = LoraRegistry()
        self._stats: dict[str, Any] | None = None
        self._stats_ns = 0
        self._background = BackgroundTasks(self._background_failed)
        self._handoffs = BackgroundTasks()
        """Prefill requests read on after their handoff until TensorRT-LLM reports them final."""
        self._failure: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Build ``LLM`` (in a thread: it loads the model), run one token, describe the engine."""
        settings = self.settings
        try:
            api, known = _import_api()
        except ImportError as exc:
            raise ConfigurationError(
                f"trtllm: TensorRT-LLM is not importable ({exc}); on a GPU machine: "
                "pip install --extra-index-url https://pypi.nvidia.com 'openengine-gateway[trtllm]'"
            ) from None
        check_version(api.version)
        kwargs = llm_kwargs(settings.llm_options, known, role=settings.role)
        try:
            self._llm = await asyncio.to_thread(api.LLM, settings.model, **kwargs)
        except (ValueError, TypeError) as exc:  # pydantic's errors are ValueErrors
            raise ConfigurationError(f"trtllm: TensorRT-LLM rejected its arguments: {exc}") from None
        except AssertionError as exc:  # its executor asserts on configurations it cannot start with
            raise ConfigurationError(
                f"trtllm: TensorRT-LLM could not start with these arguments (an assertion in its start-up: "
                f"{exc or 'no message'}); see docs/backends/trtllm.md for the options it needs"
            ) from None
        self._api = api
        try:
            self._features = capabilities.EngineFeatures(
                has_tokenizer=self._llm.tokenizer is not None, eos_token_ids=capabilities.eos_ids(self._llm)
            )
            first_stats = await self._warm_up()
            model_dir = Path(getattr(self._llm, "_hf_model_dir", None) or settings.model)
            self._features = capabilities.engine_features(
                self._llm,
                stats=first_stats,
                role=settings.role,
                max_top_logprobs=api.max_top_logprobs,
                handoff_fields=frozenset(field.name for field in dataclasses.fields(api.DisaggregatedParams)),
                generation_config=await asyncio.to_thread(generation_config.read, model_dir),
            )
        except BaseException:
            await asyncio.to_thread(self._llm.shutdown)
            self._llm = None
            raise
        if self._statistics_on():
            self._background.spawn(self._pump_stats(), "TensorRT-LLM statistics reader")
        features = self._features
        log.info("TensorRT-LLM: unset sampling knobs take %s", dict(features.sampling.values))
        if features.sampling.dropped:
            log.warning(
                "TensorRT-LLM: the model's generation-config defaults %s are not applied: this engine's sampler "
                "ignores them (sampler_type TRTLLMSampler applies them)",
                dict(features.sampling.dropped),
            )
        return EngineFacts(
            engine_name=capabilities.ENGINE_NAME,
            engine_version=api.version,
            model=capabilities.model_info(features, settings.model),
            role=features.role,
            parallelism=capabilities.parallelism(features),
            kv_connector=capabilities.kv_connector(features),
            publishes_kv_events=features.kv_events,
        )

    async def _warm_up(self) -> dict[str, Any] | None:
        """One token through the engine; the first iteration statistics hold the resolved KV pool."""
        params = self._api_().SamplingParams(max_tokens=1, **self._end_id())
        await self._llm.generate_async({"prompt_token_ids": [0]}, sampling_params=params)
        latest = None
        if not self._statistics_on():
            return None
        async for stat in self._llm.get_stats_async(timeout=STATS_TIMEOUT_S):
            latest = stat
        if latest is not None:
            self._stats, self._stats_ns = latest, time.time_ns()
        return latest

    async def stop(self) -> None:
        """Stop the background readers, shut TensorRT-LLM down."""
        await self._background.stop()
        await self._handoffs.stop()
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> EventStream:
        """Tokenize, map, build ``SamplingParams`` and submit, all before acceptance; then stream."""
        llm = self._running()
        api = self._api_()
        features = self._features
        lora = self._loras.request(request.lora_name)
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = list(llm.tokenizer.encode(request.prompt))
        plan = mapping.plan_generation(request, features, prompt_len=len(prompt_ids))
        try:
            guided = api.GuidedDecodingParams(**plan.guided) if plan.guided else None
            params = api.SamplingParams(**plan.sampling, guided_decoding=guided)
            kwargs = self._submit_kwargs(api, plan, request, lora)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"TensorRT-LLM rejected the request: {exc}") from None
        try:
            handle = llm.generate_async(
                {"prompt_token_ids": prompt_ids}, sampling_params=params, streaming=True, **kwargs
            )
        except ValueError as exc:
            raise InvalidArgument(f"TensorRT-LLM rejected the request: {exc}") from None
        except RuntimeError as exc:
            # A RequestError (executor/utils.py) is this request's refusal; any other RuntimeError is
            # "LLM is shutting down", or a dead worker's error (executor/proxy.py): the engine is done.
            if is_request_error(exc):
                raise refusal(exc) from None
            self._failure = f"TensorRT-LLM cannot take requests: {exc}"
            raise Unavailable(self._failure) from None
        self._handles[request.request_id] = handle
        tokenizer = llm.tokenizer
        stream = RequestStream(
            request,
            end_id=features.eos_token_ids[0] if features.eos_token_ids else None,
            decode=(lambda token: tokenizer.decode([token])) if tokenizer is not None else (lambda _: ""),
            prefill=features.role == pb.ENGINE_ROLE_PREFILL,
            transfer_backend=features.transfer_backend,
        )
        return EventStream.from_iterator(self._run(request.request_id, handle, stream))

    @staticmethod
    def _submit_kwargs(
        api: _Api, plan: mapping.GenerationPlan, request: GenerationRequest, lora: Any
    ) -> dict[str, Any]:
        """``generate_async`` keyword arguments besides the prompt and ``SamplingParams``."""
        kwargs: dict[str, Any] = {}
        if lora is not None:
            kwargs["lora_request"] = lora
        if plan.disaggregated is not None:
            kwargs["disaggregated_params"] = _disaggregated_params(api, plan.disaggregated)
        if plan.attention_dp_rank is not None:
            kwargs["scheduling_params"] = api.SchedulingParams(
                attention_dp_rank=plan.attention_dp_rank, attention_dp_relax=False
            )
        if request.cache_salt is not None:
            kwargs["cache_salt"] = request.cache_salt
        if plan.priority is not None:
            kwargs["priority"] = plan.priority
        return kwargs

    async def _run(self, request_id: str, handle: Any, stream: RequestStream) -> AsyncIterator[GenerationEvent]:
        started = False
        try:
            async for result in handle:
                for event in stream.events(result):
                    started = True
                    yield event
                if stream.done:
                    return
            raise EngineFailure(
                pb.ERROR_CODE_INTERNAL, f"TensorRT-LLM ended the request with outputs {stream.unfinished()} open"
            )
        except (EngineFailure, RequestError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # broad on purpose: every TensorRT-LLM failure becomes one EngineError
            if is_request_error(exc) and not started:  # refused on enqueue: still a status (spi.Backend.generate)
                raise refusal(exc) from None
            raise EngineFailure(pb.ERROR_CODE_INTERNAL, f"TensorRT-LLM failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._handles.pop(request_id, None)
            if not handle.finished and stream.session is not None:  # aborting would cancel the KV transfer
                self._handoffs.spawn(_read_to_the_end(handle), f"TensorRT-LLM context request {request_id}")
            elif not handle.finished:
                _abort(handle)  # outputs ended by a stop string, or the stream closed early

    async def abort(self, request_id: str) -> None:
        """Abort through TensorRT-LLM's handle of the request; idempotent."""
        handle = self._handles.pop(request_id, None)
        if handle is not None:
            _abort(handle)

    # -- LoRA -----------------------------------------------------------------------------

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """Register a ``LoRARequest`` and prime it with one token, so a bad adapter fails here."""
        llm = self._running()
        api = self._api_()
        self._loras.check_id(adapter)
        check_adapter(adapter.lora_name, adapter.source_path, _max_lora_rank(llm))
        try:
            lora = api.LoRARequest(adapter.lora_name, adapter.lora_id, adapter.source_path)
            params = api.SamplingParams(max_tokens=1, **self._end_id())
            await llm.generate_async({"prompt_token_ids": [0]}, sampling_params=params, lora_request=lora)
        except Exception as exc:  # broad on purpose: TensorRT-LLM raises many kinds for a bad adapter
            raise InvalidArgument(f"TensorRT-LLM could not load adapter {adapter.lora_name!r}: {exc}") from None
        self._loras.add(adapter, lora)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """Stop serving the adapter (TensorRT-LLM evicts its weights from its cache by itself)."""
        self._loras.remove(adapter.lora_name)

    # -- health, load, KV events ----------------------------------------------------------

    async def check_health(self) -> list[HealthCheck]:
        """Whether the engine runs and its statistics reader is alive (the probe runs a real token)."""
        if self._llm is None:
            return [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, "engine stopped")]
        if self._failure is not None:
            return [HealthCheck("model", pb.HEALTH_STATE_NOT_READY, self._failure)]
        return [HealthCheck("model", pb.HEALTH_STATE_READY, "TensorRT-LLM engine running")]

    async def load(self) -> Load:
        """The latest iteration statistics, corrected to zero when nothing is in flight."""
        idle = not self._handles
        return capabilities.load_info(
            self._stats,
            in_flight=len(self._handles),
            total_blocks=self._features.total_kv_blocks,
            timestamp_ns=time.time_ns() if idle or self._stats is None else self._stats_ns,
            kv_outlives_requests=self._features.role == pb.ENGINE_ROLE_PREFILL,
        )

    async def _pump_stats(self) -> None:
        """Keep the latest iteration statistics (reading them is destructive: one reader)."""
        async for stat in _poll(self._running().get_stats_async):
            self._stats, self._stats_ns = stat, time.time_ns()

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """TensorRT-LLM's KV cache events, partial blocks withheld."""
        return self._kv_batches()

    async def _kv_batches(self) -> AsyncIterator[KvEventBatch]:
        mapper = KvEventMapper(self._features.tokens_per_block)
        async for event in _poll(self._running().get_kv_cache_events_async):
            batch = mapper.batch(event, timestamp_ns=time.time_ns())
            if batch is not None:
                yield batch

    # -- helpers --------------------------------------------------------------------------

    def _background_failed(self, what: str, exc: Exception) -> None:
        """A dead background reader makes the engine NOT_READY."""
        self._failure = f"{what} failed: {exc!r}"

    def _statistics_on(self) -> bool:
        """Whether TensorRT-LLM keeps iteration statistics (asking otherwise only logs a warning)."""
        return bool(getattr(self._llm.args, "enable_iter_perf_stats", False))

    def _end_id(self) -> dict[str, int]:
        """``end_id`` for an engine without a tokenizer (TensorRT-LLM reads it off the tokenizer)."""
        eos = self._features.eos_token_ids
        return {"end_id": eos[0]} if not self._features.has_tokenizer and eos else {}

    def _running(self) -> Any:
        if self._llm is None:
            raise Unavailable("the TensorRT-LLM engine is not running")
        return self._llm

    def _api_(self) -> _Api:
        assert self._api is not None, "start() imports TensorRT-LLM"
        return self._api


def _max_lora_rank(llm: Any) -> int | None:
    """The engine's ``lora_config.max_lora_rank`` (a dict or TensorRT-LLM's ``LoraConfig``; 64 by default)."""
    config = getattr(llm.args, "lora_config", None)
    rank = config.get("max_lora_rank", 64) if isinstance(config, dict) else getattr(config, "max_lora_rank", None)
    return int(rank) if rank is not None else None


def _disaggregated_params(api: _Api, params: dict[str, Any]) -> Any:
    """``DisaggregatedParams``; a handoff's first-token logprob rows as ``Logprob``s (``mapping.handoff_params``)."""
    positions = params.get("first_gen_log_probs")
    if positions is not None:
        rows = [
            position if isinstance(position, float) else {t: api.Logprob(*entry) for t, entry in position.items()}
            for position in positions
        ]
        params = {**params, "first_gen_log_probs": rows}
    return api.DisaggregatedParams(**params)


def _abort(handle: Any) -> None:
    """``RequestOutput.abort``, which may fail harmlessly for a request that just finished."""
    try:
        handle.abort()
    except Exception:  # broad on purpose: aborting a request that just finished is harmless
        log.debug("TensorRT-LLM abort of request %s failed", getattr(handle, "request_id", "?"), exc_info=True)


async def _read_to_the_end(handle: Any) -> None:
    """Read a handed-off context request until TensorRT-LLM reports it final (its KV transfer done)."""
    async for _ in handle:
        pass


async def _poll(read: Callable[..., AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """Entries of a TensorRT-LLM ``IterationResult`` queue, forever.

    Once a read times out the ``IterationResult`` reports empty until the next request arrives,
    so an empty read is followed by a short pause instead of a busy loop.
    """
    while True:
        empty = True
        async for entry in read(timeout=STATS_TIMEOUT_S):
            empty = False
            yield entry
        if empty:
            await asyncio.sleep(IDLE_POLL_S)


__all__ = ["IDLE_POLL_S", "STATS_TIMEOUT_S", "TrtllmBackend"]
