"""A stand-in for TensorRT-LLM's ``LLM`` (1.2.1, or 1.3.0rc29: ``fake_api.RELEASES``) over a tiny model.

Each behaviour names the upstream file it follows (the 1.2.1-era text unless a release is named):

* ``llmapi/llm.py``: ``generate_async`` submits at once; ``_check_arguments`` refuses a prompt over
  ``max_num_tokens`` with a ``ValueError`` unless chunked prefill is on or the request is
  generation-only (or the worker's ``RequestError``, as older proxies raised it); it returns one
  ``RequestOutput`` that every step mutates and yields again: token ids, text and logprobs are
  cumulative; ``await`` runs it to the end; ``args.max_seq_len`` stays None unless given;
* ``_torch/pyexecutor/py_executor_creator.py``: a ``lora_config`` without ``lora_target_modules``
  that does not name exactly one ``lora_dir`` is an ``AssertionError`` at start;
* ``executor/base_worker.py``, ``_enqueue_request``: what it raises inside its ``try`` is a
  ``RequestError``, which the proxy delivers while the result is read; on 1.2.1 an adapter that does
  not load and a context-only request under the overlap scheduler raise before that ``try``, and
  ``executor/worker.py`` (``worker_main``) lets anything but a ``RequestError`` end the worker: the
  request fails and every later submission raises; 1.3 wraps the adapter's failure and has no
  overlap check; a ``lora_request`` is ignored (the base model serves it) without a ``lora_config``;
  ``_deduce_max_tokens`` cuts ``max_tokens`` to what the resolved ``max_seq_len`` leaves, and for a
  prompt that leaves nothing 1.2.1 only warns (what its executor then does is not modelled: the fake
  raises ``NotImplementedError``) while 1.3 raises (a ``RequestError``); ``abort_request`` of a
  finished request only logs that it cannot;
* ``_torch/pyexecutor/_util.py``, ``resource_manager.py``: the executor's ``max_seq_len`` is
  the given one or the model's ``max_position_embeddings``, cut to what the KV pool holds;
* ``_torch/pyexecutor/py_executor.py``: a context-only request stops after one token; the executor
  keeps the KV cache (``ctx_in_transmission_requests``) until a generation-only request pulls it; a
  generation-only output starts with the context's first token, which has no logprob unless the
  handoff carries ``first_gen_log_probs`` (1.3); by default (``HANDOFF_ORDER`` ``"final"``) the
  result is final with the handoff; ``grpc/openengine/streaming.py`` (the servicer's
  pending-handoff path) handles the two other orders the executor can produce, modelled by
  ``HANDOFF_ORDER``: ``"handoff_first"`` (the handoff before the result is final, which it becomes
  once the KV transfer is done: when the generation side pulls it; an abort cancels the transfer)
  and ``"finish_first"`` (the finish reason a step before the handoff);
* ``_torch/pyexecutor/sampler.py`` (``TorchSampler``, the default ``sampler_type``): greedy,
  temperature, top-k and top-p only; penalties, ``min_p`` and the seed are ignored (one
  generator seeded 42 serves every request); ``TRTLLMSampler`` takes the seed (its penalties
  are accepted and not modelled here); ``min_tokens`` masks the end id alone
  (``_apply_min_length_penalty``); a logprob row is the top-k ``{token_id: Logprob(logprob,
  rank)}`` of the unscaled distribution (``torch.topk`` over ``log_softmax``), nothing more: a
  sampled token outside them has no logprob;
* ``executor/result.py``: an EOS is left out of the output; a stop token id is trimmed unless
  ``include_stop_str_in_output`` (its logprob row is not);
* guided decoding is ignored unless the engine has a ``guided_decoding_backend`` (regexes, and so
  choices, are then enforced; other guides are recorded only);
* ``get_stats_async`` / ``get_kv_cache_events_async`` return one ``IterationResult`` each that
  stops after ``timeout`` without an entry and stays empty until the next request;
* KV events are dicts as ``KVCacheEventSerializer`` writes them, partial blocks included,
  64-bit unsigned hashes.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import random
from collections import OrderedDict
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from .fake_api import RELEASES, Release, SamplingParams, TorchLlmArgs

PIECES = [
    "<unk>",
    "</s>",
    "<s>",
    *" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,!?:;'\"-()[]{}|*+^$/\\0123456789\n",
]
EOS, BOS, SPECIAL = 1, 2, 3
IDS = {piece: token for token, piece in enumerate(PIECES)}
TOTAL_BLOCKS = 64
STEP_S = 0.0
"""Seconds one engine step takes (tests that need requests in flight raise it)."""
CONTEXTS: dict[int, RequestOutput] = {}
"""Context-only requests whose KV cache the executor keeps for their generation side, across every fake engine."""
OVERLAP_REFUSAL = "Context only requests are not supported in pytorch backend when overlap is enabled."
"""``BaseWorker._enqueue_request``'s words for a context-only request under the overlap scheduler."""
ENGINES: list[LLM] = []
"""Every fake engine started since ``install``, for tests to look into."""
RELEASE: Release = RELEASES["1.2.1"]
"""The release faked (``fake_api.install`` sets it)."""
HANDOFF_ORDER = "final"
"""How a context-only request reaches its handoff: ``"final"``, ``"handoff_first"`` or ``"finish_first"``."""


class RequestError(RuntimeError):
    """``tensorrt_llm.executor.utils.RequestError``: the executor refuses this request."""


log = logging.getLogger(__name__)


class Tokenizer:
    """One character per token, with ``<s>`` prepended like a Llama tokenizer."""

    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [BOS] * add_special_tokens + [IDS.get(char, 0) for char in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[t] for t in token_ids if not (skip_special_tokens and t < SPECIAL))


def logprobs(context: Sequence[int], lora_id: int = 0) -> list[float]:
    """The tiny model's next-token distribution: deterministic; after a '.' it says EOS."""
    last, n = context[-1], len(context)
    scores = [((t * 29 + last * 13 + n * 7 + lora_id * 31) % 89) / 8.0 for t in range(len(PIECES))]
    scores[0] = scores[BOS] = -30.0
    scores[EOS] = 20.0 if last == IDS["."] else -5.0
    top = max(scores)
    norm = top + math.log(sum(math.exp(s - top) for s in scores))
    return [s - norm for s in scores]


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    disaggregated_params: Any = None
    sampled: int = 0


class IterationResult:
    """An async iterable of queued entries that ends after ``timeout`` seconds without one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._done = False
        self._timeout = 2.0

    def set_timeout(self, timeout: float) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        self._done = False

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            raise StopAsyncIteration
        try:
            return await asyncio.wait_for(self.queue.get(), self._timeout)
        except TimeoutError:
            self._done = True
            raise StopAsyncIteration from None


class RequestOutput:
    """One request: ``async for`` yields this same object after every engine step."""

    def __init__(self, llm: LLM, request_id: int, prompt: list[int], params: SamplingParams, **options: Any) -> None:
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.options = options
        self.cached_tokens = 0
        self._outputs = [CompletionOutput(i) for i in range(params.best_of or 1)]
        self._done = False
        self._aborted = False
        self._steps = 0
        disagg = options.get("disaggregated_params")
        self._context_only = disagg is not None and disagg.request_type == "context_only"
        self._from_context = disagg.ctx_request_id if disagg is not None and not self._context_only else None
        self._pulled = asyncio.Event()
        """Set when the generation side took this context's KV cache (or an abort cancelled the transfer)."""

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        if self._done:  # base_worker.abort_request: the executor no longer knows the request
            log.warning("Request of client_id %s is finished, cannot abort it.", self.request_id)
            return
        self._aborted = True
        if CONTEXTS.get(self.request_id) is self:  # handed off, not yet pulled: the KV transfer is cancelled
            del CONTEXTS[self.request_id]
        self._pulled.set()

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._context_only and self._outputs[0].disaggregated_params is not None:
            await self._pulled.wait()  # final once the KV transfer is done (or cancelled)
        await asyncio.sleep(STEP_S)
        self._step()
        return self

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self

    def __await__(self) -> Generator[Any, None, RequestOutput]:
        return self.aresult().__await__()

    def _step(self) -> None:
        llm, params = self._llm, self.sampling_params
        self._steps += 1
        if self._aborted:
            for output in self._outputs:
                output.finish_reason = output.finish_reason or "cancelled"
            CONTEXTS.pop(self.request_id, None)  # the KV transfer is cancelled
            self._finish(store=False)
            return
        if self._context_only and self._outputs[0].disaggregated_params is not None:
            self._finish(store=False)  # the KV transfer is done
            llm.record_stats()
            return
        if self._steps == 1:
            self._first_step(llm)
        if not (self._context_only and self._steps > 1):  # a context request samples its one token only
            for output in self._outputs:
                if output.finish_reason is None:
                    self._sample(output, params)
                if output.finish_reason is None and output.sampled >= params.max_tokens:
                    output.finish_reason = "length"
                output.text = llm.tokenizer_for_text.decode(output.token_ids, skip_special_tokens=True)
        if self._context_only and (HANDOFF_ORDER != "finish_first" or self._steps > 1):
            self._hand_off()
        elif not self._context_only and all(output.finish_reason for output in self._outputs):
            self._finish(store=True)
        llm.record_stats()

    def _hand_off(self) -> None:
        """The context's handoff; the executor keeps its KV cache for the generation side."""
        output = self._outputs[0]
        extra: dict[str, Any] = {}
        if "first_gen_log_probs" in RELEASE.disaggregated_params.__dataclass_fields__ and output.logprobs:
            extra["first_gen_log_probs"] = list(output.logprobs)
        output.disaggregated_params = RELEASE.disaggregated_params(
            request_type="context_only",
            first_gen_tokens=list(output.token_ids),
            ctx_request_id=self.request_id,
            opaque_state=b"\x00ctx-%d" % self.request_id,
            **extra,
        )
        CONTEXTS[self.request_id] = self
        if HANDOFF_ORDER != "handoff_first":
            self._finish(store=False)

    def _first_step(self, llm: LLM) -> None:
        """``BaseWorker._enqueue_request``: what it refuses arrives here, as the result is read."""
        args = llm.args
        overlap = not args.disable_overlap_scheduler and args.cache_transceiver_config
        if self._context_only and overlap and RELEASE.overlap_refuses_context_only:
            llm.worker_failed(ValueError(OVERLAP_REFUSAL))
        lora = self.options.get("lora_request")
        loaded = lora is None or (Path(lora.lora_path) / "adapter_config.json").exists()
        if llm.lora_enabled and not loaded:  # without a lora_config the base model serves it
            failure = ValueError(f"failed to load LoRA adapter from {lora.lora_path}")
            if not RELEASE.worker_wraps_all:
                llm.worker_failed(failure)
            raise RequestError(f"Failed to load LoRA adapter: {failure}")
        room = llm.max_seq_len - len(self.prompt_token_ids)
        if room <= 0 and RELEASE.worker_wraps_all:
            raise RequestError(
                f"`default_max_tokens` ({room}) must be greater than 0, `default_max_tokens` ({room}) = max_seq_len "
                f"({llm.max_seq_len}) - `splited_prompt_len` ({len(self.prompt_token_ids)}) - `query_token_len` (0)"
            )
        if room <= 0:
            log.warning("`default_max_tokens` (%d) should be greater than 0", room)
            raise NotImplementedError("the fake does not model 1.2.1's executor with a prompt max_seq_len cannot hold")
        self.cached_tokens = llm.cached_prefix(self.prompt_token_ids, self.options.get("cache_salt"))
        if self._from_context is not None:
            context = CONTEXTS.pop(self._from_context, None)
            if context is None or context.prompt_token_ids != self.prompt_token_ids:
                raise RuntimeError(f"no context request {self._from_context} holds this prompt")
            context._pulled.set()
            handoff = self.options["disaggregated_params"]
            first = handoff.first_gen_tokens
            self._outputs[0].token_ids.extend(first)
            self._outputs[0].sampled = len(first)
            if getattr(handoff, "first_gen_log_probs", None) and self.sampling_params.logprobs:
                self._outputs[0].logprobs.extend(handoff.first_gen_log_probs)

    def _sample(self, output: CompletionOutput, params: SamplingParams) -> None:
        context = [*self.prompt_token_ids, *output.token_ids]
        lora = self.options.get("lora_request")
        scores = logprobs(context, lora.lora_int_id if lora is not None and self._llm.lora_enabled else 0)
        holding = output.sampled < (params.min_tokens or 0) and not params.ignore_eos
        banned = {EOS} if holding else set()  # the end id alone: a caller's stop token may still be sampled
        allowed = self._llm.guide_allows(params, output.text)
        candidates = [EOS, *range(SPECIAL, len(PIECES))]
        choices = [t for t in candidates if t not in banned and allowed(t)] or [EOS]
        token = self._choose(choices, scores, params, output)
        output.sampled += 1
        output.token_ids.append(token)
        if params.logprobs:
            ranked = sorted(range(len(scores)), key=lambda t: (-scores[t], t))
            output.logprobs.append(
                {t: Logprob(scores[t], rank) for rank, t in enumerate(ranked[: params.logprobs], start=1)}
            )
        if token == EOS and not params.ignore_eos:
            output.token_ids.pop()  # the executor leaves the end id out, with its logprob
            if params.logprobs:
                output.logprobs.pop()
            output.finish_reason = "stop"
        elif token in (params.stop_token_ids or ()):
            output.finish_reason, output.stop_reason = "stop", token
            if not params.include_stop_str_in_output:
                output.token_ids.pop()

    def _choose(self, choices: list[int], scores: list[float], params: SamplingParams, output: CompletionOutput) -> int:
        if params._greedy_decoding:
            return max(choices, key=lambda t: (scores[t], -t))
        rng = self._llm.generator
        if self._llm.args.sampler_type == "TRTLLMSampler" and params.seed is not None:
            rng = random.Random(hash((params.seed, output.index, output.sampled)))
        ranked = sorted(choices, key=lambda t: (-scores[t], t))[: params.top_k or None]  # top-k, then top-p
        temperature = params.temperature or 1.0
        weights = [math.exp(scores[t] / temperature) for t in ranked]
        kept, mass = 0, 0.0
        while kept < len(ranked) and mass < (params.top_p if params.top_p is not None else 1.0) * sum(weights):
            mass += weights[kept]
            kept += 1
        return rng.choices(ranked[: max(kept, 1)], weights[: max(kept, 1)])[0]

    def _finish(self, *, store: bool) -> None:
        self._done = True
        if store:
            self._llm.store(self.prompt_token_ids + self._outputs[0].token_ids, self.options.get("cache_salt"))


class LLM:
    """``tensorrt_llm.LLM`` (PyTorch backend), its constructor and methods the driver calls."""

    refusal: type[Exception] = ValueError
    """How submission refuses an over-long prompt: ``llm.py``'s ``ValueError``, or the worker's
    ``RequestError`` as proxies that wait for the enqueue (``executor/proxy.py``) raise it."""

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.args = TorchLlmArgs(
            model=model,
            skip_tokenizer_init=skip_tokenizer_init,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            **kwargs,
        )
        lora = self.args.lora_config
        if lora is not None and len(lora.get("lora_dir") or ()) != 1:  # py_executor_creator.create_py_executor
            assert len(lora.get("lora_target_modules") or ()) >= 1, "Expecting at least one lora target module"
        self.tokenizer_for_text = Tokenizer()
        self.tokenizer: Tokenizer | None = None if skip_tokenizer_init else self.tokenizer_for_text
        self._hf_model_config = type("Config", (), {"max_position_embeddings": 256, "eos_token_id": EOS})()
        self._hf_model_dir = Path(model)
        self.generator = random.Random(42)
        """``TorchSampler``'s one generator: every request draws from it, in step order."""
        self.submitted: list[RequestOutput] = []
        self._ids = itertools.count(1)
        self._stats = IterationResult()
        self._events = IterationResult()
        self._iterations = 0
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._shutdown = False
        self.worker_error: Exception | None = None
        """What ended the worker process (``executor/worker.py``, ``worker_main``), if anything did."""
        self._event_ids = itertools.count()
        self._event("created", num_blocks_per_cache_level=[TOTAL_BLOCKS, 0])
        ENGINES.append(self)

    def worker_failed(self, error: Exception) -> None:
        """An exception outside ``_enqueue_request``'s ``RequestError`` wrapper ends the worker."""
        self.worker_error = RuntimeError(f"Executor worker returned error: {error}")
        raise error

    @property
    def lora_enabled(self) -> bool:
        """``BaseWorker`` builds its LoRA manager only for a ``lora_config`` (``enable_lora`` is the TRT backend's)."""
        return self.args.lora_config is not None

    @property
    def max_seq_len(self) -> int:
        """The executor's resolved ``max_seq_len`` (not ``args.max_seq_len``, None unless given)."""
        configured = self.args.max_seq_len or self._hf_model_config.max_position_embeddings
        return min(configured, TOTAL_BLOCKS * self.args.kv_cache_config.tokens_per_block)

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> RequestOutput:
        return self._submit(
            inputs,
            sampling_params,
            **{k: v for k, v in locals().items() if k not in ("self", "inputs", "sampling_params")},
        )

    def _submit(self, inputs: Any, params: SamplingParams | None, **options: Any) -> RequestOutput:
        if self._shutdown:
            raise RuntimeError("LLM is shutting down")
        if self.worker_error is not None:  # executor/proxy.py: a dead worker's error, raised on submission
            raise self.worker_error
        params = (params or SamplingParams())._setup(self.tokenizer)
        if params.stop:
            raise NotImplementedError("the fake does not implement TensorRT-LLM's stop strings")
        disagg = options.get("disaggregated_params")
        if disagg is not None and disagg.request_type == "context_only":
            params.max_tokens = 1
        prompt = (
            list(inputs["prompt_token_ids"]) if isinstance(inputs, dict) else self.tokenizer_for_text.encode(inputs)
        )
        max_num_tokens = self.args.max_num_tokens
        generation_only = disagg is not None and disagg.request_type == "generation_only"
        bounded = not self.args.enable_chunked_prefill and not generation_only and max_num_tokens
        if bounded and len(prompt) > max_num_tokens:
            raise self.refusal(f"The sum of prompt length ({len(prompt)}) should not exceed max_num_tokens")
        if (params.best_of or 1) > (self.args.max_batch_size or 1):
            raise ValueError("sampling_params.n cannot exceed max_batch_size")
        params.max_tokens = min(params.max_tokens, max(self.max_seq_len - len(prompt), 1))  # _deduce_max_tokens
        handle = RequestOutput(self, next(self._ids), prompt, params, **options)
        self.submitted.append(handle)
        self._stats.mark_undone()
        self._events.mark_undone()
        return handle

    def get_stats_async(self, timeout: float | None = 2) -> IterationResult:
        self._stats.set_timeout(timeout or 2)
        return self._stats

    def get_kv_cache_events_async(self, timeout: float | None = 2) -> IterationResult:
        self._events.set_timeout(timeout or 2)
        return self._events

    def shutdown(self) -> None:
        self._shutdown = True

    # -- the engine's insides ------------------------------------------------------------

    def guide_allows(self, params: SamplingParams, text: str) -> Any:
        """Which tokens keep a regex guide satisfiable (everything without a grammar backend)."""
        guide = params.guided_decoding
        if guide is None or guide.regex is None or self.args.guided_decoding_backend is None:
            return lambda _token: True
        pattern = regex.compile(guide.regex)

        def allowed(token: int) -> bool:
            if token == EOS:
                return pattern.fullmatch(text) is not None
            return token >= SPECIAL and pattern.fullmatch(text + PIECES[token], partial=True) is not None

        return allowed

    def record_stats(self) -> None:
        self._iterations += 1
        if not self.args.enable_iter_perf_stats:
            return
        active = [h for h in self.submitted if not h.finished]
        used = sum(-(-len(h.prompt_token_ids) // self.args.kv_cache_config.tokens_per_block) for h in active)
        self._stats.queue.put_nowait(
            {
                "iter": self._iterations,
                "numActiveRequests": len(active),
                "numQueuedRequests": 0,
                "kvCacheStats": {
                    "maxNumBlocks": TOTAL_BLOCKS,
                    "freeNumBlocks": TOTAL_BLOCKS - used,
                    "usedNumBlocks": used,
                    "tokensPerBlock": self.args.kv_cache_config.tokens_per_block,
                },
                "inflightBatchingStats": {
                    "numContextRequests": 0,
                    "numGenRequests": len(active),
                    "numPausedRequests": 0,
                },
            }
        )

    def _blocks(self, tokens: Sequence[int], salt: str | None) -> list[tuple[int, list[int]]]:
        size, parent, blocks = self.args.kv_cache_config.tokens_per_block, 0, []
        for start in range(0, len(tokens), size):
            chunk = list(tokens[start : start + size])
            digest = hashlib.sha256(repr((salt, parent, chunk)).encode()).digest()
            parent = int.from_bytes(digest[:8], "big")
            blocks.append((parent, chunk))
        return blocks

    def cached_prefix(self, prompt: Sequence[int], salt: str | None) -> int:
        size, matched = self.args.kv_cache_config.tokens_per_block, 0
        for block_hash, chunk in self._blocks(prompt, salt):
            if len(chunk) < size or block_hash not in self._cache:
                break
            matched += size
        return min(matched, len(prompt) - 1)

    def store(self, tokens: Sequence[int], salt: str | None) -> None:
        """Keep the sequence's blocks (a trailing partial one too), announce them, evict the oldest."""
        parent, new = None, []
        for block_hash, chunk in self._blocks(tokens, salt):
            if block_hash in self._cache:
                parent = block_hash
                continue
            self._cache[block_hash] = len(chunk)
            new.append(
                {
                    "type": "stored_block",
                    "block_hash": block_hash,
                    "cache_level": 0,
                    "priority": 35,
                    "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in chunk],
                }
            )
        if new:
            self._event("stored", parent_hash=parent, blocks=new)
        evicted = []
        while len(self._cache) > TOTAL_BLOCKS:
            evicted.append(self._cache.popitem(last=False)[0])
        if evicted:
            self._event("removed", block_hashes=evicted)

    def _event(self, kind: str, **data: Any) -> None:
        if self.args.kv_cache_config.event_buffer_max_size <= 0:
            return
        event: dict[str, Any] = {"event_id": next(self._event_ids), "data": {"type": kind, **data}, "window_size": 256}
        if self.args.enable_attention_dp:
            event["attention_dp_rank"] = 0
        self._events.queue.put_nowait(event)


class PriorityLLM(LLM):
    """A later release's ``LLM``: ``generate_async`` also takes a priority in [0, 1]."""

    def generate_async(  # type: ignore[override]
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
        priority: float = 0.5,
    ) -> RequestOutput:
        if not 0 <= priority <= 1:
            raise ValueError(f"priority must be in [0, 1], got {priority}")
        return self._submit(
            inputs,
            sampling_params,
            **{k: v for k, v in locals().items() if k not in ("self", "inputs", "sampling_params")},
        )


__all__ = [
    "BOS",
    "CONTEXTS",
    "ENGINES",
    "EOS",
    "IDS",
    "LLM",
    "PIECES",
    "TOTAL_BLOCKS",
    "PriorityLLM",
    "Tokenizer",
    "logprobs",
]
