"""SGLang's real streamed output dictionaries → the driver's events (``outputs.RequestStream``).

The request goes through SGLang's ``TokenizerManager.generate_request`` as ``engine.py`` submits it;
the scheduler's side is played here: ``BatchTokenIDOutput`` messages (new token ids as the
scheduler keeps them, a matched stop token included, logprob values and indices, SGLang's own
finish-reason objects) go through SGLang's real ``DetokenizerManager`` (incremental detokenization,
stop trimming) and its ``BatchStrOutput`` through the manager's real ``_handle_batch_output``, which
builds the dictionaries (``meta_info``, logprob tuples with their texts, cumulative ids, deferred
text) that the driver reads.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, mapping
from openengine_backends.sglang.outputs import RequestStream
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import (
    CandidateSelection,
    GenerationEvent,
    GenerationRequest,
    LogprobRequest,
    OutputFinished,
    PromptTokens,
    Sampling,
    Stopping,
    TokenDelta,
    UsageReport,
)

from .admission import plan, submitted

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def detokenizer(server_args: Any) -> Any:
    """SGLang's detokenizer, in this process, on sockets of its own."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.server_args import PortArgs

    return DetokenizerManager(server_args, PortArgs.init_new(server_args))


@pytest.fixture(scope="module")
def limits(tokenizer_manager: Any, internal_state: dict[str, Any]) -> mapping.EngineLimits:
    return capabilities.engine_limits(capabilities.engine_state(tokenizer_manager, internal_state))


class Step:
    """One scheduler message for one request: its new tokens and what came with them."""

    def __init__(
        self,
        ids: Sequence[int],
        *,
        finish: Any = None,
        logprobs: Sequence[float] | None = None,
        tops: Sequence[Sequence[tuple[float, int]]] | None = None,
        prompt_logprobs: Sequence[float | None] | None = None,
        cached: int = 0,
    ) -> None:
        self.ids, self.finish, self.cached = list(ids), finish, cached
        self.logprobs, self.tops, self.prompt_logprobs = logprobs, tops, prompt_logprobs


class Session:
    """One SGLang request, submitted through the real tokenizer manager, fed by ``Step``s."""

    def __init__(
        self, manager: Any, request: GenerationRequest, limits: mapping.EngineLimits, detokenizer: Any
    ) -> None:
        self.manager, self.detokenizer = manager, detokenizer
        self.tokenized: Any = None
        generation, self.prompt = plan(manager, request, limits)
        (self.fields,) = submitted(generation, request.request_id)
        self.completion = 0
        self.stream = RequestStream(
            request,
            eos_token_ids=limits.eos_token_ids,
            prompt_ids=self.prompt,
            decode=mapping.text_decoder(manager.tokenizer),
        )

    async def open(self) -> AsyncIterator[dict[str, Any]]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        sent = asyncio.Event()

        async def send(tokenized: Any) -> None:
            self.tokenized = tokenized
            sent.set()

        if self.manager.event_loop is None:
            self.manager.event_loop = asyncio.get_running_loop()
        self.manager._send_one_request = send
        outputs = self.manager.generate_request(GenerateReqInput(**self.fields), None)
        self.next: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(outputs.__anext__())
        await asyncio.wait_for(sent.wait(), timeout=10)
        return outputs

    def message(self, step: Step) -> Any:
        """The ``BatchStrOutput`` SGLang's detokenizer makes of the scheduler's message for ``step``."""
        from sglang.srt.managers.io_struct import BatchTokenIDOutput

        first = self.completion == 0
        self.completion += len(step.ids)
        tail = list(self.prompt or ())[-5:]  # the scheduler's surrounding ids (INIT_INCREMENTAL_DETOKENIZATION_OFFSET)
        count = len(step.ids)
        logprobs = list(step.logprobs) if step.logprobs is not None else [-0.5] * count
        tops = [[v for v, _ in row] for row in step.tops] if step.tops else [[] for _ in range(count)]
        top_ids = [[i for _, i in row] for row in step.tops] if step.tops else [[] for _ in range(count)]
        prompt = step.prompt_logprobs
        params = self.tokenized.sampling_params
        message = BatchTokenIDOutput(
            rids=[self.fields["rid"]],
            finished_reasons=[None if step.finish is None else step.finish.to_json()],
            decoded_texts=[""],
            decode_ids=[tail + step.ids if first else step.ids],
            read_offsets=[len(tail)],
            output_ids=[array("q", step.ids)],
            skip_special_tokens=[params.skip_special_tokens],
            spaces_between_special_tokens=[params.spaces_between_special_tokens],
            no_stop_trim=[params.no_stop_trim],
            prompt_tokens=[len(self.prompt or ())],
            reasoning_tokens=[0],
            completion_tokens=[self.completion],
            cached_tokens=[step.cached],
            input_token_logprobs_val=[list(prompt)] if prompt is not None else [],
            input_token_logprobs_idx=[list(self.prompt or ())] if prompt is not None else [],
            output_token_logprobs_val=[logprobs],
            output_token_logprobs_idx=[list(step.ids)],
            input_top_logprobs_val=[[[] for _ in prompt]] if prompt is not None else [],
            input_top_logprobs_idx=[[[] for _ in prompt]] if prompt is not None else [],
            output_top_logprobs_val=[tops],
            output_top_logprobs_idx=[top_ids],
            input_token_ids_logprobs_val=[],
            input_token_ids_logprobs_idx=[],
            output_token_ids_logprobs_val=[[[] for _ in range(count)]],
            output_token_ids_logprobs_idx=[[[] for _ in range(count)]],
            output_token_entropy_val=None,
            output_token_sampling_mask=None,
            output_hidden_states=None,
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=None,
            placeholder_tokens_val=None,
            retraction_counts=[0],
        )
        return self.detokenizer.handle_batch_token_id_out(message)

    async def run(self, *batches: Sequence[Step]) -> list[GenerationEvent]:
        """Feed each batch of steps (several steps queue up before the driver reads, as under load)."""
        outputs = await self.open()
        events: list[GenerationEvent] = []
        try:
            for steps in batches:
                for step in steps:
                    await self.manager._handle_batch_output(self.message(step))
                out = await asyncio.wait_for(self.next, timeout=10)
                events += self.stream.events(0, out)
                if self.stream.finished(0):
                    break
                self.next = asyncio.ensure_future(outputs.__anext__())
        finally:
            self.next.cancel()
            await outputs.aclose()
        return events


def tokens(text: str, manager: Any) -> list[int]:
    return list(manager.tokenizer.encode(text, add_special_tokens=False))


def deltas(events: Sequence[GenerationEvent]) -> list[TokenDelta]:
    return [event for event in events if isinstance(event, TokenDelta)]


def finish_of(events: Sequence[GenerationEvent]) -> OutputFinished:
    (finish,) = [event for event in events if isinstance(event, OutputFinished)]
    return finish


async def test_text_and_tokens_stream_as_deltas_and_end_at_the_length(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    ids = tokens(" the quick brown fox jumps", tokenizer_manager)
    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT, stopping=Stopping(max_tokens=len(ids)))
    session = Session(tokenizer_manager, request, limits, detokenizer)
    middle = len(ids) // 2
    events = await session.run([Step(ids[:middle])], [Step(ids[middle:], finish=FINISH_LENGTH(len(ids)))])
    streamed = deltas(events)
    assert [record.token_id for delta in streamed for record in delta.tokens] == ids
    assert "".join(delta.text for delta in streamed) == tokenizer_manager.tokenizer.decode(ids)
    assert finish_of(events).reason == pb.FINISH_REASON_LENGTH
    usage = [event for event in events if isinstance(event, UsageReport)][-1]
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(PROMPT), len(ids))


async def test_queued_outputs_are_read_once_and_nothing_is_lost(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    """SGLang hands the consumer only the last of the outputs queued since it last read
    (``_stream_one_response``); its ids and text are cumulative, so nothing is lost."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    ids = tokens(" seven wizards quietly hex bold jumping zebras", tokenizer_manager)
    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT)
    session = Session(tokenizer_manager, request, limits, detokenizer)
    steps = [Step([token]) for token in ids[:-1]] + [Step(ids[-1:], finish=FINISH_LENGTH(len(ids)))]
    events = await session.run(steps[:3], steps[3:])
    streamed = deltas(events)
    assert len(streamed) == 2
    assert [record.token_id for delta in streamed for record in delta.tokens] == ids
    assert "".join(delta.text for delta in streamed) == tokenizer_manager.tokenizer.decode(ids)


async def test_a_stop_string_ends_the_output_with_its_match(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_STR

    ids = tokens(" the lazy dog", tokenizer_manager)
    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT, stopping=Stopping(stop_texts=("dog",)))
    session = Session(tokenizer_manager, request, limits, detokenizer)
    trimmed = tokenizer_manager.tokenizer.decode(ids).removesuffix("dog")
    events = await session.run([Step(ids, finish=FINISH_MATCHED_STR("dog"))])
    finish = finish_of(events)
    assert finish.reason == pb.FINISH_REASON_STOP and finish.stop is not None and finish.stop.stop_text == "dog"
    assert "".join(delta.text for delta in deltas(events)) == trimmed


async def test_eos_ends_the_output_as_a_token_without_text(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN

    eos = tokenizer_manager.tokenizer.eos_token_id
    ids = [*tokens(" the fox", tokenizer_manager), eos]
    session = Session(tokenizer_manager, GenerationRequest("r", "tiny", prompt_token_ids=PROMPT), limits, detokenizer)
    events = await session.run([Step(ids, finish=FINISH_MATCHED_TOKEN(eos))])
    finish = finish_of(events)
    assert finish.reason == pb.FINISH_REASON_STOP and finish.stop is not None
    assert finish.stop.eos_token_id == eos
    assert [record.token_id for delta in deltas(events) for record in delta.tokens] == ids


async def test_output_logprobs_carry_sglangs_token_texts_and_ranked_candidates(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    ids = tokens(" quick brown", tokenizer_manager)
    alternative = tokens(" lazy", tokenizer_manager)[0]
    tops = [[(-0.1, token), (-2.5, alternative)] for token in ids]
    selection = CandidateSelection(mode=pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, top_n=2)
    request = GenerationRequest(
        "r", "tiny", prompt_token_ids=PROMPT, output_logprobs=LogprobRequest(candidates=selection)
    )
    session = Session(tokenizer_manager, request, limits, detokenizer)
    logprobs = [-0.1] * len(ids)
    events = await session.run([Step(ids, logprobs=logprobs, tops=tops, finish=FINISH_LENGTH(len(ids)))])
    records = [record for delta in deltas(events) for record in delta.tokens]
    assert [record.token_id for record in records] == ids
    for record, token in zip(records, ids, strict=True):
        assert record.logprob == pytest.approx(-0.1)
        assert record.token == tokenizer_manager.tokenizer.decode([token])
        assert record.rank == 1
        assert [c.token_id for c in record.candidates] == [token, alternative]
        assert record.candidates[1].token == tokenizer_manager.tokenizer.decode([alternative])


async def test_prompt_logprobs_skip_sglangs_first_unscored_entry(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    request = GenerationRequest(
        "r", "tiny", prompt_token_ids=PROMPT, prompt_logprobs=LogprobRequest(), stopping=Stopping(max_tokens=1)
    )
    session = Session(tokenizer_manager, request, limits, detokenizer)
    prompt_logprobs = [None, -1.0, -2.0, -3.0]
    events = await session.run([Step([9], prompt_logprobs=prompt_logprobs, finish=FINISH_LENGTH(1))])
    (prompt,) = [event for event in events if isinstance(event, PromptTokens)]
    assert [record.token_id for record in prompt.tokens] == PROMPT
    assert [record.logprob for record in prompt.tokens] == prompt_logprobs


@pytest.mark.parametrize(
    ("status", "code"),
    [(None, None), (503, pb.ERROR_CODE_OVERLOADED), (400, pb.ERROR_CODE_INVALID_ARGUMENT)],
)
async def test_an_abort_is_a_cancellation_or_the_failure_its_status_says(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits, status: int | None, code: int | None
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    session = Session(tokenizer_manager, GenerationRequest("r", "tiny", prompt_token_ids=PROMPT), limits, detokenizer)
    step = Step([9], finish=FINISH_ABORT("queue is full", status_code=status))
    if code is None:
        assert finish_of(await session.run([step])).reason == pb.FINISH_REASON_CANCELLED
        return
    with pytest.raises(EngineFailure) as failure:
        await session.run([step])
    assert failure.value.code == code


async def test_cached_prompt_tokens_are_reported(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT, sampling=Sampling(temperature=0.0))
    session = Session(tokenizer_manager, request, limits, detokenizer)
    events = await session.run([Step([9], cached=3, finish=FINISH_LENGTH(1))])
    usage = [event for event in events if isinstance(event, UsageReport)][-1]
    assert usage.cached_prompt_tokens == 3


@pytest.mark.parametrize("include", [False, True])
async def test_a_callers_stop_token_ends_the_output_and_shows_only_when_asked(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits, include: bool
) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN

    stop = tokens(" dog", tokenizer_manager)[0]
    ids = [*tokens(" the lazy", tokenizer_manager), stop]
    stopping = Stopping(stop_token_ids=(stop,), include_stop_in_output=include)
    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT, stopping=stopping)
    session = Session(tokenizer_manager, request, limits, detokenizer)
    shown = ids if include else ids[:-1]
    text = tokenizer_manager.tokenizer.decode(shown)
    events = await session.run([Step(ids, finish=FINISH_MATCHED_TOKEN(stop))])
    finish = finish_of(events)
    assert finish.stop is not None and finish.stop.stop_token_id == stop
    assert [record.token_id for delta in deltas(events) for record in delta.tokens] == shown
    assert "".join(delta.text for delta in deltas(events)) == text


async def test_with_ignore_eos_the_driver_ends_the_output_at_a_callers_stop_token(
    tokenizer_manager: Any, detokenizer: Any, limits: mapping.EngineLimits
) -> None:
    """SGLang's ``ignore_eos`` disables every token stop: the driver watches for the caller's own and
    ends the output there, though SGLang's stream runs on (the engine then closes it)."""
    stop = tokens(" dog", tokenizer_manager)[0]
    before, after = tokens(" the lazy", tokenizer_manager), tokens(" jumps over", tokenizer_manager)
    stopping = Stopping(stop_token_ids=(stop,), ignore_eos=True)
    request = GenerationRequest("r", "tiny", prompt_token_ids=PROMPT, stopping=stopping)
    session = Session(tokenizer_manager, request, limits, detokenizer)
    assert session.fields["sampling_params"]["ignore_eos"] is True
    events = await session.run([Step(before)], [Step([stop, *after])])
    finish = finish_of(events)
    assert finish.reason == pb.FINISH_REASON_STOP and finish.stop is not None and finish.stop.stop_token_id == stop
    assert [record.token_id for delta in deltas(events) for record in delta.tokens] == before
    assert "".join(delta.text for delta in deltas(events)) == tokenizer_manager.tokenizer.decode(before)
    usage = [event for event in events if isinstance(event, UsageReport)][-1]
    assert usage.completion_tokens == len(before) + 1, "the stop token counts as generated"
