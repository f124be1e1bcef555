"""``MockBackend``: the simulated engine behind the SPI.

``generate`` validates synchronously (everything the engine cannot take is a pre-acceptance
``RequestError``), builds the request's engine state and queues it on a rank; that rank's
step loop feeds the returned ``EventStream`` directly. ``fail`` and ``restart`` simulate an
engine crash and recovery for fault-injection tests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable

import numpy as np
from openengine_gateway import __version__, pb
from openengine_gateway.errors import EngineFailure, InvalidArgument, ResourceExhausted, Unavailable
from openengine_gateway.spi import (
    Backend,
    Classification,
    ClassifyCall,
    EmbedCall,
    Embedding,
    EngineFacts,
    EventStream,
    GenerationRequest,
    Guidance,
    HealthCheck,
    KvEventBatch,
    Load,
    LoadedAdapters,
    LoraAdapter,
    ScoreCall,
    ScoreResult,
    StopTextMatcher,
    TaskUsage,
    resolve_max_tokens,
)

from . import capabilities
from .events import Outbox
from .guided import Guide, make_guides
from .kv_cache import CacheKey
from .model import PseudoModel
from .request import MockRequest, Output
from .sampling import Sampler, output_rng
from .scheduler import EngineCore
from .settings import MockSettings
from .tasks import TaskModel
from .tokenizer import TOKENIZER_ID, VOCAB_SIZE, encode_input
from .transfer import TRANSFER_BACKEND, SessionStore, pull, tcp_endpoint

GUIDE_CHECKS = 2
"""Regex guides built in threads at once: the rest wait their turn, so a burst of costly patterns takes at
most this many cores (``regex`` releases the GIL while it matches)."""


class MockBackend(Backend[MockSettings]):
    """A CPU-only simulated inference engine (see the package docstring)."""

    name = "mock"
    Settings = MockSettings

    def __init__(self, settings: MockSettings) -> None:
        super().__init__(settings)
        self.model = PseudoModel(settings.seed)
        self._tasks = TaskModel(
            settings.seed,
            settings.embedding_dimension,
            settings.classify_labels,
            self.model,
            settings.max_context_length,
            lambda tokens: tokens * settings.prefill_time_per_token_s,
        )
        self._kv_events: Outbox[KvEventBatch] = Outbox(settings.event_queue_size, "KV event")
        self._runtime_events: Outbox[pb.RuntimeEvent] = Outbox(settings.event_queue_size, "runtime event")
        self.sessions: SessionStore | None = None
        if settings.role == "prefill":
            self.sessions = SessionStore(
                settings.kv_transfer_host,
                settings.kv_transfer_port,
                settings.kv_session_timeout_s,
                self._runtime_events.put,
            )
        self.cores = [
            EngineCore(rank, settings, self.model, self._kv_events, self._runtime_events, self.sessions)
            for rank in range(settings.data_parallel_size)
        ]
        for core in self.cores:
            core.on_crash = self.fail
        self._loras: LoadedAdapters[LoraAdapter] = LoadedAdapters("the mock engine")
        self._rng = np.random.default_rng([settings.seed, 0x73616D70])
        self._faults = np.random.default_rng([settings.seed, 0x6661756C])
        self._arrivals = itertools.count()
        self._guide_checks = asyncio.Semaphore(GUIDE_CHECKS)
        self._started = False
        self.failure: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        """Start the rank loops (and the transfer server of a prefill engine)."""
        settings = self.settings
        endpoint = None
        if self.sessions is not None:
            await self.sessions.start()
            local = self.sessions.endpoint
            endpoint = pb.KvEndpoint(host=local.host, port=local.port, protocol=local.protocol)
        for core in self.cores:
            core.start()
        self._started = True
        return EngineFacts(
            engine_name="mock",
            engine_version=__version__,
            model=capabilities.model_info(settings),
            role=capabilities.ROLES[settings.role],
            parallelism=capabilities.parallelism(settings),
            kv_connector=capabilities.kv_connector(settings, endpoint),
            publishes_kv_events=settings.enable_kv_events,
            publishes_runtime_events=settings.enable_runtime_events,
            lora_adapters=(),
            tokenizer_id=TOKENIZER_ID,
        )

    async def stop(self) -> None:
        """Stop the loops and the transfer server."""
        self._started = False
        for core in self.cores:
            await core.stop()
        if self.sessions is not None:
            await self.sessions.stop()

    def fail(self, message: str) -> None:
        """Simulate a crash: every request fails (retryable INTERNAL), health is NOT_READY,
        new requests are UNAVAILABLE, held KV sessions are lost."""
        self.failure = message
        if self.sessions is not None:
            self.sessions.release_all("failed")
        for core in self.cores:
            core.fail(message)

    def restart(self) -> None:
        """Recover from ``fail`` (crashing first if healthy): an empty KV cache, READY again."""
        if self.failure is None:
            self.fail("the engine is restarting")
        for core in self.cores:
            core.clear_cache()
            core.start()
        self.failure = None

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> EventStream:
        """Validate, queue on a rank, and return the stream that rank's loop feeds."""
        self._check_serving()
        settings = self.settings
        prefill_only = settings.role == "prefill"
        session = request.kv_session
        if session is not None:
            if session.transfer_backend != TRANSFER_BACKEND:
                raise InvalidArgument(
                    f"kv.session.transfer_backend {session.transfer_backend!r} is not this engine's "
                    f"({TRANSFER_BACKEND!r})"
                )
            if tcp_endpoint(session) is None:
                raise InvalidArgument("kv.session names no tcp endpoint with a host and port to pull from")
        lora_id, lora_name = self._lora(request.lora_name)
        prompt = encode_input(request.prompt, request.prompt_token_ids, request.media)
        if request.prompt_logprobs is not None and request.prompt_logprob_start >= len(prompt):
            raise InvalidArgument(
                f"response.prompt_logprob_start ({request.prompt_logprob_start}) is past the prompt "
                f"({len(prompt)} tokens)"
            )
        for wanted in (request.prompt_logprobs, request.output_logprobs):
            selection = wanted.candidates if wanted is not None else None
            if selection is not None and any(t >= VOCAB_SIZE for t in selection.token_ids):
                raise InvalidArgument(f"candidate token ids must be below the vocabulary size {VOCAB_SIZE}")
        if any(t >= VOCAB_SIZE for t in request.stopping.stop_token_ids):
            raise InvalidArgument(f"stop token ids must be below the vocabulary size {VOCAB_SIZE}")
        max_tokens = resolve_max_tokens(request, len(prompt), settings.max_context_length, settings.max_output_tokens)
        count = 1 if prefill_only else request.sampling.num_sequences
        self._check_capacity(len(prompt), 0 if prefill_only else max_tokens, count)
        if settings.fault_rate and self._faults.random() < settings.fault_rate:
            return _failed(EngineFailure(pb.ERROR_CODE_INTERNAL, "injected fault (fault_rate)", retryable=True))
        core = self._rank(request)
        stopping = request.stopping

        def queue(guides: list[Guide] | None, stream: EventStream) -> EventStream:
            outputs = [
                Output(
                    index,
                    list(prompt),
                    Sampler(self.model, request.sampling, output_rng(request.sampling.seed, index, self._rng), prompt),
                    guides[index] if guides is not None and not prefill_only else None,  # prefill: checked only
                    StopTextMatcher(stopping.stop_texts, include_stop=stopping.include_stop_in_output),
                )
                for index in range(count)
            ]
            engine_request = MockRequest(
                spec=request,
                prompt=prompt,
                outputs=outputs,
                stream=stream,
                key=CacheKey(lora_id, lora_name, request.cache_salt),
                max_tokens=max_tokens,
                prefill_only=prefill_only,
                arrival=next(self._arrivals),
                priority=request.priority or 0,
            )
            if session is not None:
                engine_request.transfer = asyncio.get_running_loop().create_task(
                    pull(session, settings.kv_transfer_timeout_s), name=f"pull {session.session_id}"
                )
            core.add(engine_request)
            return stream

        guidance = request.guidance
        if guidance is None:
            return queue(None, EventStream())
        if guidance.mode != pb.GUIDED_DECODING_MODE_REGEX:
            return queue(make_guides(guidance, count), EventStream())  # a choice's check is a trie walk
        stream = EventStream()
        checked = self._queue_when_checked(guidance, count, queue, stream)
        stream.producer = asyncio.get_running_loop().create_task(checked)
        return stream

    async def _queue_when_checked(
        self,
        guidance: Guidance,
        count: int,
        queue: Callable[[list[Guide] | None, EventStream], EventStream],
        stream: EventStream,
    ) -> None:
        """Build a regex's guides off the event loop, a few at a time, then queue the request; a refusal ends
        its stream with INVALID_ARGUMENT, which the gateway answers as a refusal before acceptance.

        Its cost is bounded first (``guided.check_cost``, on the loop: a scan of the pattern), but its first
        mask can still take the whole mask budget, and every other client would wait that long."""
        try:
            async with self._guide_checks:
                guides = await asyncio.to_thread(make_guides, guidance, count)
        except InvalidArgument as error:
            stream.fail(error)
            return
        if not stream.closed:
            queue(guides, stream)

    def _check_serving(self) -> None:
        if self.failure is not None:
            raise Unavailable(f"the mock engine failed: {self.failure}", retry_after_ms=1000)
        if not self._started:
            raise Unavailable("the mock engine is not running")

    def _lora(self, name: str | None) -> tuple[int, str]:
        adapter = self._loras.find(name)
        return (0, "") if adapter is None else (adapter.lora_id, adapter.lora_name)

    def _check_capacity(self, prompt: int, max_tokens: int, outputs: int) -> None:
        """Reject a request whose outputs could never fit the KV cache together."""
        size = self.settings.kv_block_size
        shared = prompt // size
        per_output = -(-(prompt + max_tokens) // size) - shared
        needed = shared + outputs * per_output
        if needed > self.settings.total_kv_blocks:
            raise InvalidArgument(
                f"the request may need {needed} KV blocks; the engine has {self.settings.total_kv_blocks} "
                "(lower max_tokens or num_sequences)"
            )

    def _rank(self, request: GenerationRequest) -> EngineCore:
        if request.data_parallel_rank is not None:
            if request.data_parallel_rank >= len(self.cores):
                raise InvalidArgument(f"kv.data_parallel_rank must be below {len(self.cores)}")
            return self.cores[request.data_parallel_rank]
        return min(self.cores, key=lambda core: len(core.running) + len(core.waiting))

    async def abort(self, request_id: str) -> None:
        """Remove the request from whichever rank holds it; idempotent."""
        for core in self.cores:
            if core.abort(request_id):
                return

    async def abort_kv_session(self, session_id: str) -> bool:
        """Release a held prefill session."""
        return self.sessions is not None and self.sessions.release(session_id, "aborted")

    async def abort_all_kv_sessions(self) -> int:
        """Release every held prefill session."""
        return self.sessions.release_all("aborted") if self.sessions is not None else 0

    # -- LoRA -----------------------------------------------------------------------------

    async def load_lora(self, adapter: LoraAdapter) -> None:
        """Register an adapter directory; its id is mixed into the pseudo-model."""
        if not await asyncio.to_thread(os.path.isdir, adapter.source_path):
            raise InvalidArgument(f"LoRA source_path {adapter.source_path!r} is not a directory")
        if len(self._loras) >= self.settings.max_loras:
            raise ResourceExhausted(f"the mock engine holds at most {self.settings.max_loras} LoRA adapters")
        self._loras.add(adapter.lora_name, adapter)

    async def unload_lora(self, adapter: LoraAdapter) -> None:
        """Forget an adapter and every cached block computed with it."""
        self._loras.find(adapter.lora_name)  # NotFound unless loaded
        self._loras.remove(adapter.lora_name)
        self._tasks.forget(adapter.lora_id)
        self.model.forget(adapter.lora_id)
        for core in self.cores:
            core.kv.drop_lora(adapter.lora_id)
            core.flush_events()

    # -- tasks ----------------------------------------------------------------------------

    async def embed(self, call: EmbedCall) -> tuple[list[Embedding], TaskUsage]:
        """Dense or sparse embeddings per sequence or token."""
        self._check_serving()
        return await self._tasks.embed(call, self._lora(call.context.lora_name)[0])

    async def classify(self, call: ClassifyCall) -> tuple[list[Classification], TaskUsage]:
        """Label scores per sequence or token."""
        self._check_serving()
        return await self._tasks.classify(call, self._lora(call.context.lora_name)[0])

    async def score(self, call: ScoreCall) -> tuple[ScoreResult, TaskUsage]:
        """Native similarity or label-token scores."""
        self._check_serving()
        return await self._tasks.score(call, self._lora(call.context.lora_name)[0])

    # -- observability --------------------------------------------------------------------

    async def load(self) -> Load:
        """Every load scalar, summed over ranks, and one entry per rank."""
        ranks = [core.rank_load() for core in self.cores]
        return Load(
            running_requests=sum(r.running_requests or 0 for r in ranks),
            queued_requests=sum(r.queued_requests or 0 for r in ranks),
            active_kv_sessions=len(self.sessions) if self.sessions is not None else 0,
            used_kv_blocks=sum(r.used_kv_blocks or 0 for r in ranks),
            total_kv_blocks=sum(r.total_kv_blocks or 0 for r in ranks),
            running_tokens=sum(core.running_tokens() for core in self.cores),
            waiting_tokens=sum(core.waiting_tokens() for core in self.cores),
            prefill_batch_size=sum(r.prefill_batch_size or 0 for r in ranks),
            decode_batch_size=sum(r.decode_batch_size or 0 for r in ranks),
            ranks=ranks,
        )

    async def check_health(self) -> list[HealthCheck]:
        """The scheduler loops, the model, and (prefill role) the transfer server."""
        dead = [core.rank for core in self.cores if not core.alive]
        if self.failure is not None or dead:
            reason = self.failure or f"the scheduler loop of ranks {dead} is not running"
            scheduler = HealthCheck("scheduler", pb.HEALTH_STATE_NOT_READY, reason)
        else:
            running = sum(len(core.running) for core in self.cores)
            waiting = sum(len(core.waiting) for core in self.cores)
            message = f"{len(self.cores)} ranks stepping; {running} running, {waiting} waiting"
            scheduler = HealthCheck("scheduler", pb.HEALTH_STATE_READY, message)
        checks = [scheduler, HealthCheck("model", pb.HEALTH_STATE_READY, "pseudo-model ready")]
        if self.sessions is not None:
            listening = self.sessions.listening
            checks.append(
                HealthCheck(
                    "kv_connector",
                    pb.HEALTH_STATE_READY if listening else pb.HEALTH_STATE_NOT_READY,
                    "transfer server listening" if listening else "transfer server is not listening",
                )
            )
        return checks

    def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """KV-event batches, one per step that changed the cache; fails when the consumer lags."""
        if not self.settings.enable_kv_events:
            return super().kv_events()
        return self._kv_events.attach()

    def runtime_events(self) -> AsyncIterator[pb.RuntimeEvent]:
        """Forward-pass, batch, queue and transfer events; fails when the consumer lags."""
        if not self.settings.enable_runtime_events:
            return super().runtime_events()
        return self._runtime_events.attach()


def _failed(failure: EngineFailure) -> EventStream:
    """A stream of an accepted request that ends with ``failure`` before any event."""
    stream = EventStream()
    stream.fail(failure)
    return stream


__all__ = ["MockBackend"]
