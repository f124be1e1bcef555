"""``sglang.Engine`` as far as SGLang 0.5.23 runs on this CPU: its real ``TokenizerManager`` and
``DetokenizerManager`` in the gateway's process, with the scheduler (CUDA only) played here.

``entrypoints/engine.py`` resolves and publishes the ``ServerArgs``, starts the scheduler and
detokenizer processes and builds the ``TokenizerManager`` in the gateway's process. Here the same
``ServerArgs`` resolution and the same ``TokenizerManager`` run; what a scheduler process would do is
played in place of ``_send_one_request`` (``managers/tokenizer_manager.py``): each request decodes
one token every ``STEP_S``, as ``BatchTokenIDOutput`` messages (``managers/io_struct.py``) that SGLang's
real detokenizer turns into the ``BatchStrOutput`` its tokenizer manager handles, ending with
``FINISH_LENGTH`` (``managers/schedule_batch.py``). The scheduler's answers to ``get_internal_state``
(its resolved arguments) and ``get_loads`` (``managers/load_snapshot.py``) are played too. So the
driver's start runs SGLang's real ``auto_create_handle_loop`` on the gateway's loop, with its real
signal handlers, output loop, SIGTERM watchdog and ``print_exception_wrapper``.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from typing import Any

STEP_S = 0.02
"""One decode step of the played scheduler."""
RESERVED_OUTPUT = 5
"""``max_req_input_len = max_req_len - 5`` (``managers/tp_worker.py``), as the scheduler reports it."""
TOKEN = 17
"""The token every step decodes (not EOS; requests here ignore EOS anyway)."""


STARTED: list[CpuEngine] = []
"""Engines built in this process, for the tests to ``close``."""


class CpuEngine:
    """What the driver calls on ``sglang.Engine``, on SGLang's real tokenizer side."""

    def __init__(self, **kwargs: Any) -> None:
        from sglang.srt.managers.detokenizer_manager import DetokenizerManager
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import PortArgs, ServerArgs

        args = ServerArgs(**kwargs)
        args.resolve_once()
        args.check_server_args()
        publish(args, role="tokenizer")
        self.port_args = PortArgs.init_new(args)
        manager = self.tokenizer_manager = TokenizerManager(args, self.port_args)
        manager.max_req_input_len = manager.context_len - 1 - RESERVED_OUTPUT
        manager._send_one_request = self._schedule
        manager.get_internal_state = self._internal_state
        manager.get_loads = self._loads
        self.detokenizer = DetokenizerManager(args, PortArgs.init_new(args))
        self.decoding: set[asyncio.Task[None]] = set()
        STARTED.append(self)

    def get_all_child_pids(self) -> list[int]:
        return []  # the played scheduler runs in this process

    def shutdown(self) -> None:
        for task in self.decoding:
            task.get_loop().call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        """Drop what SGLang's sockets still hold for the scheduler that is not there (an abort, its
        watchdog's ``ShutdownReq``): a garbage-collected context holding a message blocks for good."""
        for socket in (self.tokenizer_manager.send_to_scheduler, self.detokenizer.recv_from_scheduler):
            socket.context.destroy(linger=0)

    async def _internal_state(self) -> list[dict[str, Any]]:
        """``scheduler_components/internal_state.py``: the answer starts with the resolved server arguments."""
        from sglang.srt.runtime_context import get_context

        return [dict(get_context().resolved_server_args_dict())]

    async def _loads(self, include: Any = None, dp_rank: int | None = None) -> list[Any]:
        from sglang.srt.managers.load_snapshot import LoadSnapshot

        running = len(self.tokenizer_manager.rid_to_state)
        return [LoadSnapshot(timestamp=time.time(), num_running_reqs=running, max_total_num_tokens=4096)]

    async def _schedule(self, tokenized: Any) -> None:
        task = asyncio.create_task(self._decode(tokenized))
        self.decoding.add(task)
        task.add_done_callback(self.decoding.discard)

    async def _decode(self, tokenized: Any) -> None:
        from sglang.srt.managers.io_struct import BatchTokenIDOutput
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        manager, params, rid = self.tokenizer_manager, tokenized.sampling_params, tokenized.rid
        prompt = list(tokenized.input_ids)
        tail = prompt[-5:]  # the scheduler's surrounding ids (INIT_INCREMENTAL_DETOKENIZATION_OFFSET)
        budget = params.max_new_tokens
        for step in range(1, budget + 1):
            await asyncio.sleep(STEP_S)
            if rid not in manager.rid_to_state:  # aborted
                return
            finish = FINISH_LENGTH(budget).to_json() if step == budget else None
            message = BatchTokenIDOutput(
                rids=[rid],
                finished_reasons=[finish],
                decoded_texts=[""],
                decode_ids=[[*tail, TOKEN] if step == 1 else [TOKEN]],
                read_offsets=[len(tail)],
                output_ids=[array("q", [TOKEN])],
                skip_special_tokens=[params.skip_special_tokens],
                spaces_between_special_tokens=[params.spaces_between_special_tokens],
                no_stop_trim=[params.no_stop_trim],
                prompt_tokens=[len(prompt)],
                reasoning_tokens=[0],
                completion_tokens=[step],
                cached_tokens=[0],
                input_token_logprobs_val=[],
                input_token_logprobs_idx=[],
                output_token_logprobs_val=[[-0.5]],
                output_token_logprobs_idx=[[TOKEN]],
                input_top_logprobs_val=[],
                input_top_logprobs_idx=[],
                output_top_logprobs_val=[[[]]],
                output_top_logprobs_idx=[[[]]],
                input_token_ids_logprobs_val=[],
                input_token_ids_logprobs_idx=[],
                output_token_ids_logprobs_val=[[[]]],
                output_token_ids_logprobs_idx=[[[]]],
                output_token_entropy_val=None,
                output_token_sampling_mask=None,
                output_hidden_states=None,
                routed_experts=None,
                indexer_topk=None,
                placeholder_tokens_idx=None,
                placeholder_tokens_val=None,
                retraction_counts=[0],
            )
            await manager._handle_batch_output(self.detokenizer.handle_batch_token_id_out(message))
