"""A faithful fake of SGLang 0.5.23's ``Engine`` and ``TokenizerManager``, for tests only.

It keeps the call signatures and the output dictionaries SGLang's source defines
(``entrypoints/engine.py``, ``managers/tokenizer_manager.py``, ``managers/schedule_batch.py``,
``managers/detokenizer_manager.py``): cumulative streaming of ``text`` and ``output_ids``;
``meta_info`` with ``finish_reason`` dictionaries (``FINISH_MATCHED_TOKEN`` for EOS and stop ids
alike, ``FINISH_MATCHED_STR``, ``FINISH_LENGTH``, aborts without prompt counts); stop and EOS
tokens kept in ``output_ids`` with their text trimmed unless ``no_stop_trim``; partial stop
strings held back; ``ignore_eos`` disabling every token stop; prompt logprobs whose first entry
has none; abort by request-id *prefix* in the scheduler, sent only for a request id the
tokenizer manager knows; a closed stream aborting its request; prefill and decode meeting
through a bootstrap room; one radix cache, ZMQ KV-event publisher and load snapshot per DP rank
(``fake_radix_cache.py``); LoRA by adapter name.

The model: the greedy continuation of a sequence of length ``L`` is ``CYCLE[L % 13]``
("hello world." then EOS), with log-softmax logits falling off with distance from it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Sequence
from typing import Any

from .fake_api import (
    EOS,
    VOCAB,
    EmbeddingReqInput,
    GenerateReqInput,
    HTTPException,
    LoadSnapshot,
    LoRARef,
    LoRAUpdateOutput,
    ScoreResult,
    Tokenizer,
    num_dp_ranks,
    piece,
    resolved,
)
from .fake_radix_cache import RadixCache, publishers

CYCLE = [ord(c) for c in "hello world."] + [EOS]
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""A decode request with this bootstrap host needs no prefill (SGLang's health check)."""
STEP_S = 0.001
WATCHDOG_S = 0.05
"""The SIGTERM watchdog's polling period (SGLang's is 5 s)."""
"""One decode step; tests that abort mid-stream raise it."""
BOOTSTRAP_TIMEOUT_S = 5.0
ENGINES: list[Engine] = []
SCHEDULER = """
import sys, time
# managers/scheduler.py under utils/common.py configure_logger: SGLang's own text format, on stderr
print("[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 3", file=sys.stderr, flush=True)
time.sleep(0.5)
print("[2026-01-01 00:00:01 TP0] Decode batch, #running-req: 1", file=sys.stderr, flush=True)
time.sleep(600)
"""
"""The scheduler process the fake starts in a gateway process of its own (``OWN_PROCESS``)."""
PROCESS_TREE_KILLED: list[str] = []
"""Why SGLang's SIGQUIT handler would have killed this process (and the gateway in it): the fake records
it instead of killing the test run, unless it runs in a process of its own."""
OWN_PROCESS = False
"""The fake runs in a gateway process of its own (``fake_cli``): its SIGQUIT handler kills the process."""
TASK_ABORT: tuple[int, str] | None = None
"""An abort status and message the scheduler answers every non-streamed request with (a test sets it:
503 "The request queue is full." is ``managers/scheduler.py``'s answer past ``--max-queued-requests``)."""
ROOMS: dict[tuple[str, int, int], asyncio.Future[None]] = {}
ARCHITECTURES = {
    "/models/fake-llm": "LlamaForCausalLM",
    "/models/fake-embed": "BertModel",
    "/models/fake-classifier": "BertForSequenceClassification",
}
LABELS = {0: "negative", 1: "positive"}
GENERATION_CONFIGS = {"/models/fake-llm-tuned": {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": True}}
"""``generation_config.json`` of the fake models that have one."""


def reserved_tokens(args: dict[str, Any]) -> int:
    """``managers/utils.py`` ``compute_num_reserved_tokens``: EAGLE keeps its draft tokens in output slots."""
    if args["speculative_algorithm"] not in ("EAGLE", "EAGLE3"):
        return 0
    steps, topk = args["speculative_num_steps"] or 3, args["speculative_eagle_topk"] or 1
    return max(topk * steps, args["speculative_num_draft_tokens"] or 0)


def kill_process_tree(by: str = "SGLang's running-phase SIGQUIT handler") -> None:
    """``utils/common.py`` ``kill_process_tree(os.getpid())``, the gateway included."""
    PROCESS_TREE_KILLED.append(by)
    if OWN_PROCESS:
        os.kill(os.getpid(), signal.SIGKILL)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def reset() -> None:
    """Forget engines and bootstrap rooms of earlier tests."""
    ENGINES.clear()
    ROOMS.clear()
    PROCESS_TREE_KILLED.clear()


def log_softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    total = math.log(math.fsum(math.exp(v - top) for v in values))
    return [v - top - total for v in values]


def distribution(length: int, shift: int = 0) -> list[float]:
    """Log-probabilities of the next token after a sequence of ``length`` tokens."""
    chosen = CYCLE[(length + shift) % len(CYCLE)]
    return log_softmax([-abs(t - chosen) / 4 for t in range(VOCAB)])


def top(logprobs: Sequence[float], k: int, text: bool) -> list[tuple[float, int, str | None]]:
    order = sorted(range(VOCAB), key=lambda t: (-logprobs[t], t))[:k]
    return [(logprobs[t], t, piece(t) if text else None) for t in order]


class ModelConfig:
    """The ``ModelConfig`` attributes SGLang's tokenizer manager holds."""

    def __init__(self, args: dict[str, Any]) -> None:
        architecture = ARCHITECTURES.get(args["model_path"], "LlamaForCausalLM")
        self.context_len = args["context_length"] or 256
        self.sampling_defaults = args["sampling_defaults"]
        self.generation_config = GENERATION_CONFIGS.get(args["model_path"])
        self.vocab_size = VOCAB
        self.is_generation = architecture.endswith("CausalLM") and not args["is_embedding"]
        self.is_multimodal = False
        self.is_matryoshka = False
        self.hf_eos_token_id = {EOS}
        self.hf_config = types.SimpleNamespace(
            architectures=[architecture], id2label=LABELS if "Classification" in architecture else {}
        )

    def get_default_sampling_params(self) -> dict[str, Any]:
        """``configs/model_config.py``: the generation config's sampling knobs, only with
        ``--sampling-defaults model`` (the default)."""
        if self.sampling_defaults != "model" or self.generation_config is None:
            return {}
        knobs = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
        return {k: self.generation_config[k] for k in knobs if self.generation_config.get(k) is not None}


class State:
    """``ReqState``: one request the tokenizer manager knows."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.dispatched = False
        self.aborted = False
        self.tokens = 0
        self.rank = 0
        self.cached = 0


class TokenizerManager:
    """The tokenizer manager's surface: ``generate_request``, ``abort_request``, state and loads."""

    def __init__(self, args: dict[str, Any], engine: Engine) -> None:
        self.server_args = args
        self.engine = engine
        self.model_config = ModelConfig(args)
        self.is_generation = self.model_config.is_generation
        self.tokenizer = None if args["skip_tokenizer_init"] else Tokenizer()
        capacity = args["max_total_tokens"] or 4096
        self.capacity = capacity
        self.max_req_input_len = min(self.model_config.context_len - 1, capacity - 1) - 5
        self.num_reserved_tokens = reserved_tokens(args)
        self.gracefully_exit = False
        self.rid_to_state: dict[str, State] = {}
        self.handle_loop_started = False
        self.asyncio_tasks: set[asyncio.Task[None]] = set()
        self._server_stop_hook: Any = None
        self._output_failure = asyncio.Event()
        self.aborts: list[tuple[str, bool]] = []
        self.received: list[Any] = []
        page = (args["page_size"] or 1) * args["dcp_size"]  # arg_groups/overrides.py: the tree pages at page * dcp
        self.caches = [RadixCache(page, capacity) for _ in range(num_dp_ranks(args))]
        self.routed = 0
        self.adapters = {
            path.split("=")[0]: LoRARef(f"id-{i}", path.split("=")[0], path.split("=")[-1])
            for i, path in enumerate(args["lora_paths"] or ())
        }
        self.lora_registry = types.SimpleNamespace(get_all_adapters=lambda: dict(self.adapters))

    def auto_create_handle_loop(self) -> None:
        """``managers/tokenizer_manager.py`` (0.5.23): once, on the running loop, starts the output loop and
        the SIGTERM watchdog, each under ``print_exception_wrapper``, and, in the main thread, installs
        ``SignalHandler``'s handlers there: SIGTERM only sets ``gracefully_exit``, SIGQUIT
        (``running_phase_sigquit_handler``) kills the whole process tree."""
        if self.handle_loop_started:
            return
        self.handle_loop_started = True
        loop = asyncio.get_running_loop()
        self.asyncio_tasks = {
            loop.create_task(self._print_exception_wrapper(self._handle_loop)),
            loop.create_task(self._print_exception_wrapper(self._sigterm_watchdog)),
        }
        if threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGTERM, self._sigterm_handler)
            loop.add_signal_handler(signal.SIGQUIT, kill_process_tree)

    def set_server_stop_hook(self, hook: Any) -> None:
        self._server_stop_hook = hook

    def dump_requests_before_crash(self) -> None:
        """Writes the requests it holds to a crash dump (when configured to)."""

    def fail_output_loop(self) -> None:
        """An exception in ``handle_loop`` (a malformed message from the detokenizer)."""
        self._output_failure.set()

    def _sigterm_handler(self) -> None:
        """``SignalHandler.sigterm_handler``: no drain of its own, only the flag its watchdog polls."""
        self.gracefully_exit = True

    async def _handle_loop(self) -> None:
        await self._output_failure.wait()
        raise RuntimeError("malformed output from SGLang's detokenizer")

    async def _sigterm_watchdog(self) -> None:
        """``sigterm_watchdog``: after SIGTERM, waits for its own requests, kills SGLang's processes, then
        calls the server stop hook, or ``sys.exit(0)`` out of the event loop."""
        while not self.gracefully_exit or self.rid_to_state:  # noqa: ASYNC110 - SGLang's watchdog polls
            await asyncio.sleep(WATCHDOG_S)
        self.engine.child_pids = [dead_pid()]
        if self._server_stop_hook is not None:
            self._server_stop_hook()
            return
        sys.exit(0)

    async def _print_exception_wrapper(self, func: Any) -> None:
        """``print_exception_wrapper``: an exception logs, dumps the requests, then kills the process tree
        (``kill_process_tree(os.getpid(), include_parent=True)``) and exits."""
        try:
            await func()
        except Exception:
            logging.getLogger("sglang").exception("TokenizerManager hit an exception")
            self.dump_requests_before_crash()
            kill_process_tree("print_exception_wrapper")
            sys.exit(1)

    async def get_internal_state(self) -> list[dict[str, Any]]:
        args = self.server_args
        state = dict(args)
        state["memory_usage"] = {"token_capacity": self.capacity}
        state["effective_max_running_requests_per_dp"] = args["max_running_requests"] or 64
        state["disaggregation_mode"] = args["disaggregation_mode"]
        return [dict(state) for _ in self.caches]  # one per DP rank

    async def get_loads(self, include: Any = None, dp_rank: int | None = None) -> list[LoadSnapshot]:
        """``managers/load_snapshot.py``: one snapshot per DP rank, attention-DP ranks included."""
        snapshots = []
        for rank in range(len(self.caches)):
            running = [s for s in self.rid_to_state.values() if s.dispatched and s.rank == rank]
            snapshot = LoadSnapshot(timestamp=time.time(), dp_rank=rank, num_running_reqs=len(running))
            snapshot.num_used_tokens = sum(s.tokens for s in running)
            snapshot.max_total_num_tokens, snapshot.max_running_requests = self.capacity, 64
            snapshots.append(snapshot)
        return snapshots

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """SGLang's: sent to the scheduler only for a known rid, which aborts every rid it prefixes."""
        self.aborts.append((rid, abort_all))
        if not abort_all and rid not in self.rid_to_state:
            return
        for state in self.rid_to_state.values():
            if abort_all or state.rid.startswith(rid):
                state.aborted = True

    def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[Any]:
        self.received.append(obj)
        if isinstance(obj, EmbeddingReqInput):
            return self._encode(obj)
        assert isinstance(obj, GenerateReqInput)
        return self._generate(obj)

    async def _encode(self, obj: EmbeddingReqInput) -> AsyncIterator[Any]:
        if self.is_generation:
            raise ValueError("This model does not appear to be an embedding model by default.")
        if TASK_ABORT is not None:
            # managers/tokenizer_manager.py _handle_abort_finish_reason: a non-streamed request aborted with
            # 400 raises ValueError, with any other status fastapi.HTTPException.
            status, message = TASK_ABORT
            if status == 400:
                raise ValueError(message)
            raise HTTPException(status_code=status, detail=message)
        if isinstance(obj.text, list):  # a batch (normalize_batch_and_arguments): one rid per text
            assert isinstance(obj.rid, list), "The rid should be a list."
            pairs = obj.is_cross_encoder_request and all(isinstance(t, list) and len(t) == 2 for t in obj.text)
            assert pairs, "the fake batches only cross-encoder [query, document] pairs"
            yield [self._embedding(rid, " ".join(pair), obj) for rid, pair in zip(obj.rid, obj.text, strict=True)]
            return
        assert isinstance(obj.rid, str)
        yield self._embedding(obj.rid, obj.text or "", obj)

    def _embedding(self, rid: str, text: str, obj: EmbeddingReqInput) -> dict[str, Any]:
        ids = obj.input_ids if obj.input_ids is not None else Tokenizer().encode(text)
        if self.model_config.hf_config.id2label:
            embedding = [float(len(ids) % 3), -1.0]
        else:
            width = obj.dimensions or 4
            embedding = [round(math.sin(len(ids) + i), 6) for i in range(width)]
        return {"embedding": embedding, "meta_info": {"id": rid, "prompt_tokens": len(ids)}}

    async def _generate(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """``generate_request`` for one streamed request, as SGLang runs and reports it."""
        rid = obj.rid
        assert rid is not None
        if rid in self.rid_to_state:
            raise ValueError(f"Duplicate request ID detected: {rid}")
        state = self.rid_to_state[rid] = State(rid)
        try:
            ids = list(obj.input_ids) if obj.input_ids is not None else Tokenizer().encode(obj.text or "")
            params = dict(obj.sampling_params or {})
            self._validate(obj, ids, params)
            state.rank = self._route(obj)
            await asyncio.sleep(0)
            state.dispatched = True
            if self.server_args["disaggregation_mode"] == "prefill":
                async for out in self._prefill(obj, state, ids):
                    yield out
                return
            if len(ids) >= self.max_req_input_len:  # managers/utils.py validate_input_length, in the scheduler
                message = f"the input exceeds the maximum allowed length ({self.max_req_input_len} tokens)"
                yield self._finished(obj, state, ids, [], _abort(message, 400))
                return
            decode = self.server_args["disaggregation_mode"] == "decode"
            if decode and obj.bootstrap_host != FAKE_BOOTSTRAP_HOST and not await self._attach(obj):
                yield self._finished(obj, state, ids, [], _abort("KV transfer from the prefill failed", 500))
                return
            async for out in self._decode(obj, state, ids, params):
                yield out
        except BaseException:
            if self.rid_to_state.get(rid) is state and state.dispatched:
                self.abort_request(rid)
            raise
        finally:
            self.rid_to_state.pop(rid, None)

    def _route(self, obj: GenerateReqInput) -> int:
        """The request's DP rank: ``tokenizer_manager.py`` checks a routed rank against every DP rank
        (ignoring rank 0 of a single one); unrouted requests go round robin
        (``data_parallel_controller.py`` ``round_robin_scheduler``)."""
        ranks = len(self.caches)
        rank = obj.routed_dp_rank
        if rank is not None and not 0 <= rank < ranks:
            raise ValueError(f"routed_dp_rank={rank} out of range [0, {ranks})")
        if rank is None:
            rank, self.routed = self.routed % ranks, self.routed + 1
        return rank

    def _validate(self, obj: GenerateReqInput, ids: list[int], params: dict[str, Any]) -> None:
        """``_validate_one_request``: the reserved draft slots count with the input."""
        context = self.model_config.context_len
        budget = params.get("max_new_tokens", 128)
        length = len(ids) + self.num_reserved_tokens
        if length >= context:
            raise ValueError(f"The input ({length} tokens) is longer than the model's context length ({context})")
        if budget is not None and budget + length > context:
            raise ValueError("Requested token count exceeds the model's maximum context length")
        if not 0 < params.get("repetition_penalty", 1.0) <= 2:
            raise ValueError("repetition_penalty must be in (0, 2]")
        top_k = params.get("top_k", -1)
        if top_k != -1 and top_k < 1:
            raise ValueError("top_k must be -1 (disable) or at least 1")
        if obj.lora_path is not None and obj.lora_path not in self.adapters:
            raise ValueError(f"The following requested LoRA adapters are not loaded: {obj.lora_path}")

    async def _prefill(self, obj: GenerateReqInput, state: State, ids: list[int]) -> AsyncIterator[dict[str, Any]]:
        """A prefill waits in its bootstrap room for the decode side, then finishes with one token."""
        key = (str(obj.bootstrap_host), int(obj.bootstrap_port or 0), int(obj.bootstrap_room or 0))
        attached = ROOMS.setdefault(key, asyncio.get_running_loop().create_future())
        state.tokens = len(ids)
        deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
        reason: dict[str, Any] = {"type": "length", "length": 1}
        while not attached.done():
            if state.aborted:
                reason = _abort("Abort in waiting queue")
                break
            if time.monotonic() > deadline:
                reason = _abort("Request bootstrap timed out", 500)
                break
            await asyncio.sleep(STEP_S)
        ROOMS.pop(key, None)
        yield self._finished(obj, state, ids, [CYCLE[len(ids) % len(CYCLE)]], reason)

    async def _attach(self, obj: GenerateReqInput) -> bool:
        key = (str(obj.bootstrap_host), int(obj.bootstrap_port or 0), int(obj.bootstrap_room or 0))
        deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
        while key not in ROOMS:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(STEP_S)
        if not ROOMS[key].done():
            ROOMS[key].set_result(None)
        return True

    async def _decode(
        self, obj: GenerateReqInput, state: State, ids: list[int], params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        budget = params.get("max_new_tokens", 128)
        if budget is None:
            budget = self.max_req_input_len + 5 - len(ids) - 1
        stops: list[str] = list(params.get("stop") or ())
        stop_ids = set(params.get("stop_token_ids") or ())
        ignore_eos = bool(params.get("ignore_eos"))
        greedy = params.get("temperature", 1.0) < 1e-6 or params.get("top_k") == 1
        rng = random.Random(params.get("sampling_seed", obj.rid))
        shift = len(obj.lora_path or "")
        out: list[int] = []
        cache = self.caches[state.rank]
        state.cached = min(cache.match(ids, obj.cache_salt), len(ids) - 1) // cache.page_size * cache.page_size
        self._checkpoint(obj, state, ids)
        if budget == 0:  # prefill only (SGLang's scoring and prefix warm-up)
            yield self._release(obj, state, ids, out, {"type": "length", "length": 0})
            return
        while True:
            await asyncio.sleep(STEP_S)
            if state.aborted:
                yield self._release(obj, state, ids, out, _abort("Abort in waiting queue"))
                return
            logprobs = distribution(len(ids) + len(out), shift)
            token = max(range(VOCAB), key=lambda t: (logprobs[t], -t))
            if not greedy:
                token = rng.choices(range(VOCAB), weights=[math.exp(v) for v in logprobs])[0]
            out.append(token)
            state.tokens = len(ids) + len(out)
            text = Tokenizer().decode(out)
            reason: dict[str, Any] | None = None
            matched = next((s for s in stops if s in text), None)
            if matched is not None:
                reason = {"type": "stop", "matched": matched}
            elif not ignore_eos and len(out) > params.get("min_new_tokens", 0) and token in stop_ids | {EOS}:
                reason = {"type": "stop", "matched": token}
            elif len(out) >= budget:
                reason = {"type": "length", "length": budget}
            if reason is not None:
                yield self._release(obj, state, ids, out, reason)
                return
            held = any(text.endswith(s[:n]) for s in stops for n in range(1, len(s)))
            if obj.stream and not held:
                yield self._chunk(obj, ids, out, text, None, cached=self._cached(obj, ids))

    def _cached(self, obj: GenerateReqInput, ids: list[int]) -> int:
        """The prompt's prefix the rank's radix tree held when it was scheduled, in whole pages."""
        state = self.rid_to_state.get(obj.rid or "")
        return state.cached if state is not None else 0

    def _checkpoint(self, obj: GenerateReqInput, state: State, tokens: list[int]) -> None:
        """``mem_cache/common.py``: the rank's tree takes the tokens the request computed KV for, and
        the scheduler step publishes what that recorded (``publish_kv_events``)."""
        cache = self.caches[state.rank]
        cache.insert(tokens, obj.cache_salt)
        events = cache.take()
        if self.engine.publishers:
            self.engine.publishers[state.rank].publish(events)

    def _release(
        self, obj: GenerateReqInput, state: State, ids: list[int], out: list[int], reason: dict[str, Any]
    ) -> dict[str, Any]:
        """``release_kv_cache``: a finished request leaves the prompt and all but its last output token
        (whose KV was never computed) in the tree."""
        self._checkpoint(obj, state, ids + out[:-1])
        return self._finished(obj, state, ids, out, reason)

    def _finished(
        self, obj: GenerateReqInput, state: State, ids: list[int], out: list[int], reason: dict[str, Any]
    ) -> dict[str, Any]:
        text = Tokenizer().decode(out)
        keep = bool((obj.sampling_params or {}).get("no_stop_trim"))
        matched = reason.get("matched")
        if isinstance(matched, str):
            text = text[: text.find(matched) + (len(matched) if keep else 0)]
        elif isinstance(matched, int) and not keep:
            text = Tokenizer().decode(out[:-1])
        if reason["type"] == "abort":
            meta = {"id": obj.rid, "finish_reason": reason, "weight_version": "default", "completion_tokens": len(out)}
            return {"text": text, "output_ids": list(out), "meta_info": meta | self._logprobs(obj, ids, out)}
        return self._chunk(obj, ids, out, text, reason, cached=self._cached(obj, ids))

    def _chunk(
        self, obj: GenerateReqInput, ids: list[int], out: list[int], text: str, reason: Any, *, cached: int
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": obj.rid,
            "finish_reason": reason,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(out),
            "cached_tokens": cached,
        }
        return {"text": text, "output_ids": list(out), "meta_info": meta | self._logprobs(obj, ids, out)}

    def _logprobs(self, obj: GenerateReqInput, ids: list[int], out: list[int]) -> dict[str, Any]:
        """The cumulative logprob lists ``add_logprob_to_meta_info`` writes."""
        if not obj.return_logprob:
            return {}
        text, shift = obj.return_text_in_logprobs, len(obj.lora_path or "")
        k, wanted = obj.top_logprobs_num or 0, obj.token_ids_logprob

        def entry(length: int, token: int) -> tuple[float, int, str | None]:
            return (distribution(length, shift)[token], token, piece(token) if text else None)

        def extras(length: int) -> dict[str, Any]:
            logprobs = distribution(length, shift)
            return {
                "top": top(logprobs, k, text) if k else None,
                "ids": [(logprobs[t], t, piece(t) if text else None) for t in wanted or ()],
            }

        outputs = [extras(len(ids) + i) for i in range(len(out))]
        meta: dict[str, Any] = {
            "output_token_logprobs": [entry(len(ids) + i, t) for i, t in enumerate(out)],
            "output_token_logprobs_length": len(out),
        }
        start = obj.logprob_start_len if obj.logprob_start_len is not None else -1
        positions = range(start + 1, len(ids)) if start >= 0 else range(0)
        inputs = [extras(p) for p in positions]
        meta["input_token_logprobs"] = (
            [(None, ids[start], piece(ids[start]) if text else None)] + [entry(p, ids[p]) for p in positions]
            if start >= 0
            else []
        )
        if k:
            meta["input_top_logprobs"] = ([None] if start >= 0 else []) + [e["top"] for e in inputs]
            meta["output_top_logprobs"] = [e["top"] for e in outputs]
        if wanted:
            meta["input_token_ids_logprobs"] = ([None] if start >= 0 else []) + [e["ids"] for e in inputs]
            meta["output_token_ids_logprobs"] = [e["ids"] for e in outputs]
        return meta


def _abort(message: str, status: int | None = None) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status, "err_type": None}


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class Engine:
    """``sglang.Engine(**server_args)``: what the driver calls on it."""

    def __init__(self, **kwargs: Any) -> None:
        # entrypoints/engine.py: no log output unless asked; utils/common.py configure_logger replaces the
        # root logger's handlers (force=True) and sets its level.
        kwargs.setdefault("log_level", "error")
        logging.basicConfig(level=kwargs["log_level"].upper(), format="[sglang] %(message)s", force=True)
        self.server_args = resolved(kwargs)
        self.publishers = publishers(self.server_args["kv_events_config"], num_dp_ranks(self.server_args))
        self.tokenizer_manager = TokenizerManager(self.server_args, self)
        self.child_pids = [os.getpid()]
        self.scheduler: subprocess.Popen[bytes] | None = None
        if OWN_PROCESS:  # entrypoints/engine.py: the scheduler, a process of its own with the gateway's stderr
            self.scheduler = subprocess.Popen([sys.executable, "-c", SCHEDULER])
            self.child_pids = [self.scheduler.pid]
        self.shut_down = False
        self.lora_calls: list[tuple[str, ...]] = []
        ENGINES.append(self)

    def get_all_child_pids(self) -> list[int]:
        return list(self.child_pids)

    def shutdown(self) -> None:
        """``entrypoints/engine.py``: ends with ``kill_process_tree(os.getpid(), include_parent=False)``,
        which kills every child of the process: every other engine's processes die with this one's."""
        self.shut_down = True
        if self.scheduler is not None:
            self.scheduler.kill()
            self.scheduler.wait()
        for engine in ENGINES:
            if engine is not self and not engine.shut_down:
                engine.child_pids = [dead_pid()]
        for publisher in self.publishers:
            publisher.close()

    def fail_child(self) -> None:
        """A scheduler process crashes: ``utils/watchdog.py`` ``SubprocessWatchdog`` signals SIGQUIT to the
        process hosting the engine."""
        self.child_pids = [dead_pid()]
        os.kill(os.getpid(), signal.SIGQUIT)

    async def async_load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False) -> LoRAUpdateOutput:
        self.lora_calls.append(("load", lora_name, lora_path))
        if not self.server_args["enable_lora"]:
            return LoRAUpdateOutput(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        manager = self.tokenizer_manager
        manager.adapters[lora_name] = LoRARef(f"id-{lora_name}", lora_name, lora_path, pinned)
        return LoRAUpdateOutput(True, loaded_adapters={n: r.lora_path for n, r in manager.adapters.items()})

    async def async_unload_lora_adapter(self, lora_name: str) -> LoRAUpdateOutput:
        self.lora_calls.append(("unload", lora_name))
        if self.tokenizer_manager.adapters.pop(lora_name, None) is None:
            return LoRAUpdateOutput(False, f"LoRA adapter {lora_name} is not loaded")
        return LoRAUpdateOutput(True)

    async def async_score(
        self,
        query: str | list[int] | None = None,
        items: str | list[str] | list[list[int]] | None = None,
        label_token_ids: list[int] | None = None,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> ScoreResult:
        """Label-token scoring: each label's probability after query + item (softmaxed on request)."""
        manager = self.tokenizer_manager
        assert manager.is_generation and label_token_ids and items is not None and query is not None
        rows, prompt_tokens = [], 0
        for item in [items] if isinstance(items, str) else items:
            # managers/tokenizer_manager_score_mixin.py score_request: a text query and item are joined as one
            # string (f"{query}{item}", item first with item_first) and tokenized together; ids are concatenated.
            if isinstance(query, str) and isinstance(item, str):
                ids = manager.tokenizer.encode(f"{item}{query}" if item_first else f"{query}{item}")
            else:
                assert isinstance(query, list) and isinstance(item, list), "text is scored with text, ids with ids"
                ids = item + query if item_first else query + item
            length = len(ids)
            prompt_tokens += length
            logprobs = [distribution(length)[t] for t in label_token_ids]
            if apply_softmax:
                weights = [math.exp(v - max(logprobs)) for v in logprobs]
                rows.append([w / sum(weights) for w in weights])
            else:
                rows.append([math.exp(v) for v in logprobs])
        return ScoreResult(scores=rows, prompt_tokens=prompt_tokens)


__all__ = ["BOOTSTRAP_TIMEOUT_S", "CYCLE", "ENGINES", "ROOMS", "STEP_S", "Engine", "distribution", "reset"]
