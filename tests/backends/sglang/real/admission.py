"""The driver's requests through SGLang's real ``TokenizerManager.generate_request``, up to the scheduler.

``submit`` builds each output's ``GenerateReqInput`` exactly as ``engine.py``'s ``_submit`` does and
runs SGLang's own admission path (normalisation, priority and DP-rank checks, tokenization, length
validation, ``SamplingParams(**...)``, ``normalize(tokenizer)``, ``verify(vocab_size)``); the
``TokenizedGenerateReqInput`` SGLang would send its scheduler is captured instead of sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from openengine_backends.sglang import capabilities, mapping, tasks
from openengine_gateway.spi import GenerationRequest


class _Captured(Exception):
    """Raised in place of sending to the scheduler, carrying what would have been sent."""

    def __init__(self, tokenized: Any) -> None:
        super().__init__("captured")
        self.tokenized = tokenized


async def admit(manager: Any, fields: dict[str, Any]) -> Any:
    """SGLang's ``TokenizedGenerateReqInput`` for ``GenerateReqInput(**fields)``; raises what SGLang raises."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    async def capture(tokenized: Any) -> None:
        raise _Captured(tokenized)

    if manager.event_loop is None:  # no output loop, signal handlers or watchdog: no scheduler answers here
        manager.event_loop = asyncio.get_running_loop()
    manager._send_one_request = capture
    generator = manager.generate_request(GenerateReqInput(**fields), None)
    try:
        await generator.__anext__()
    except _Captured as sent:
        return sent.tokenized
    finally:
        await generator.aclose()
    raise AssertionError("SGLang answered without a scheduler")


def plan(
    manager: Any, request: GenerationRequest, limits: mapping.EngineLimits
) -> tuple[mapping.GenerationPlan, list[int] | None]:
    """The driver's plan, the prompt tokenized with SGLang's tokenizer as ``engine.generate`` does."""
    ids = request.prompt_token_ids
    if request.prompt is not None and not request.media:
        ids = mapping.tokenize(manager.tokenizer, request.prompt)
    return mapping.plan_generation(request, limits, input_ids=ids), None if ids is None else list(ids)


async def admit_all(manager: Any, request: GenerationRequest, limits: mapping.EngineLimits) -> list[Any]:
    """Every output of ``request`` as SGLang admits it (``engine._pump`` → ``_submit``)."""
    generation, _ = plan(manager, request, limits)
    return [await admit(manager, fields) for fields in submitted(generation, request.request_id)]


def submitted(generation: mapping.GenerationPlan, request_id: str) -> Sequence[dict[str, Any]]:
    """The ``GenerateReqInput`` fields of every output, as ``engine._pump`` passes them to ``_submit``."""
    return [
        {**generation.shared, **generation.outputs[index], "rid": mapping.request_rid(index + 1, request_id, index)}
        for index in range(len(generation.outputs))
    ]


async def sent_by(manager: Any, call: Any) -> list[Any]:
    """What SGLang's tokenizer manager would send its scheduler while the driver's ``call`` runs.

    Each request is captured at the scheduler's door, which fails its item (and so the call);
    the items still on their way are given a moment to reach the door too.
    """
    sent: list[Any] = []

    async def capture(tokenized: Any) -> None:
        sent.append(tokenized)
        raise _Captured(tokenized)

    if manager.event_loop is None:
        manager.event_loop = asyncio.get_running_loop()
    manager._send_one_request = capture
    try:
        await call
    except _Captured:
        await asyncio.sleep(0.2)
        return sent
    raise AssertionError("SGLang answered without a scheduler")


def runner(manager: Any, server: dict[str, Any]) -> tasks.TaskRunner:
    """The driver's task runner on SGLang's tokenizer manager and request classes (as ``engine._describe``)."""
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput

    state = capabilities.engine_state(manager, server)
    engine = SimpleNamespace(tokenizer_manager=manager)
    return tasks.TaskRunner(engine, state, capabilities.engine_limits(state), EmbeddingReqInput, GenerateReqInput)


async def answered(manager: Any, call: Any, answer: Any, count: int) -> Any:
    """``call``'s result when SGLang answers each of its ``count`` requests with ``answer(tokenized)``,
    the message its scheduler (or detokenizer) would send back, handled by the real manager."""
    sent: list[Any] = []
    arrived = asyncio.Event()

    async def send(tokenized: Any) -> None:
        sent.append(tokenized)
        if len(sent) == count:
            arrived.set()

    if manager.event_loop is None:
        manager.event_loop = asyncio.get_running_loop()
    manager._send_one_request = send
    task = asyncio.ensure_future(call)
    await asyncio.wait_for(arrived.wait(), timeout=10)
    for tokenized in sent:
        await manager._handle_batch_output(answer(tokenized))
    return await asyncio.wait_for(task, timeout=10)
