"""A generation request inside the engine, and how its sampled tokens become events.

``MockRequest`` holds what the scheduler needs (prompt, outputs with their block tables,
progress) and turns each sampled token into the SPI's events: a ``TokenDelta`` with the
token's record and its newly completed text, then, when the output ends, the
``OutputFinished`` (preceded by the request's ``UsageReport`` when it is the last one).

Stop rules: ``completion_tokens`` counts every sampled token. EOS stays in the token records
but never has text. ``include_stop_in_output`` decides whether a matched caller stop token
(its record and its text) or stop string (its text) remains in the emitted output. Before
``min_tokens`` tokens exist, EOS and stop tokens are banned from sampling and no stop string
may complete (one that begins earlier and completes later counts). Logprobs are the model's raw
distribution, before temperature and penalties.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from openengine_gateway import pb
from openengine_gateway.spi import (
    Candidate,
    CandidateSelection,
    EventStream,
    GenerationRequest,
    LogprobRequest,
    OutputFinished,
    PromptTokens,
    StopMatch,
    StopTextHit,
    StopTextMatcher,
    TokenDelta,
    TokenRecord,
    UsageReport,
    select_candidates,
    stop_match_for_token,
)

from .guided import Guide
from .kv_cache import BlockTable, CacheKey
from .model import PseudoModel
from .sampling import Sampler
from .tokenizer import EOS, VOCAB_SIZE, TextDecoder, piece

_EOS_IDS = (EOS,)


class Phase(enum.Enum):
    """Where a request is in the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Output:
    """One of a request's ``num_sequences`` outputs: its tokens, KV and stop state."""

    index: int
    tokens: list[int]
    """Prompt followed by the generated tokens."""
    sampler: Sampler
    guide: Guide | None
    matcher: StopTextMatcher
    decoder: TextDecoder = field(default_factory=TextDecoder)
    table: BlockTable = field(default_factory=BlockTable)
    computed: int = 0
    """Leading tokens whose KV exists; the last token is computed by the next step."""
    generated: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class Transferred:
    """Prefilled state pulled from a prefill engine: the tokens whose KV arrived."""

    token_ids: tuple[int, ...]
    session_id: str
    lora_name: str


@dataclass(eq=False, slots=True)
class MockRequest:
    """An accepted generation request."""

    spec: GenerationRequest
    prompt: list[int]
    outputs: list[Output]
    stream: EventStream
    key: CacheKey
    max_tokens: int
    prefill_only: bool
    arrival: int
    priority: int = 0
    phase: Phase = Phase.WAITING
    admitted: bool = False
    """Admitted at least once (a preempted request is resumed, not started)."""
    prompt_done: bool = False
    cached_tokens: int = 0
    transfer: asyncio.Task[Transferred] | None = None
    transferred: Transferred | None = None
    live: list[Output] = field(init=False)
    """Outputs still generating, in index order (kept up to date: it is read every step)."""
    ending: frozenset[int] = field(init=False)
    """Tokens that end an output once ``min_tokens`` exist: the stop tokens, and EOS unless ignored."""
    streaming: bool = field(init=False)
    """No output logprobs and no stop strings: a token that does not end its output needs no
    record beyond its piece and no stop matching (``accept``'s shortcut)."""

    def __post_init__(self) -> None:
        self.live = list(self.outputs)
        stopping = self.spec.stopping
        self.ending = frozenset((*stopping.stop_token_ids, *(() if stopping.ignore_eos else _EOS_IDS)))
        self.streaming = self.spec.output_logprobs is None and not any(stopping.stop_texts)

    @property
    def request_id(self) -> str:
        """The caller's request id."""
        return self.spec.request_id

    @property
    def ready(self) -> bool:
        """Whether it can be admitted (a decode request's KV has arrived)."""
        return self.transfer is None or self.transferred is not None

    def usage(self) -> UsageReport:
        """Cumulative counts across outputs."""
        completion = sum(o.generated for o in self.outputs)
        return UsageReport(len(self.prompt), completion, cached_prompt_tokens=self.cached_tokens)

    def banned(self, output: Output) -> Sequence[int]:
        """Tokens that may not be sampled yet: EOS and stop tokens before ``min_tokens``."""
        stopping = self.spec.stopping
        if output.generated >= stopping.min_tokens:
            return ()
        return (*(() if stopping.ignore_eos else _EOS_IDS), *stopping.stop_token_ids)

    def emit_prompt(self, model: PseudoModel) -> None:
        """The ``PromptTokens`` event, when prompt logprobs were requested."""
        wanted = self.spec.prompt_logprobs
        if wanted is None:
            return
        records = []
        for position in range(self.spec.prompt_logprob_start, len(self.prompt)):
            token = self.prompt[position]
            if position == 0:
                records.append(TokenRecord(token, piece(token)))
            else:
                row = model.row_at(self.prompt, position, self.key.lora_id)
                records.append(token_record(model, row, token, wanted))
        self.stream.put(PromptTokens(records))

    def accept(self, output: Output, token: int, row: int, model: PseudoModel) -> None:
        """Append a sampled token to ``output`` and emit what it produced."""
        output.tokens.append(token)
        output.generated += 1
        output.sampler.observe(token)
        if output.guide is not None:
            output.guide.advance(token)
        if self.streaming and token not in self.ending and output.generated < self.max_tokens:
            # The common case, as the general path below would deliver it: no logprobs, no stop
            # string to hold text back for, neither a stop token nor the last token.
            self.stream.put(TokenDelta(output.index, [TokenRecord(token, piece(token))], output.decoder.feed(token)))
            return
        stopping = self.spec.stopping
        past_min = output.generated > stopping.min_tokens  # before this token
        record = token_record(model, row, token, self.spec.output_logprobs)
        stop = stop_match_for_token(token, stopping, _EOS_IDS) if past_min else None
        if stop is not None:
            caller_token = stop.stop_token_id is not None
            include = caller_token and stopping.include_stop_in_output
            text = output.matcher.flush() + (output.decoder.feed(token) if include else "") + output.decoder.flush()
            kept = record if include or not caller_token else None
            self._deliver(output, kept, text, pb.FINISH_REASON_STOP, stop)
            return
        new_text = output.decoder.feed(token)
        fed = output.matcher.feed(new_text, armed=past_min)  # as vLLM: only a token past min_tokens completes one
        if isinstance(fed, StopTextHit):
            self._deliver(output, record, fed.text, pb.FINISH_REASON_STOP, StopMatch.text(fed.stop))
            return
        if output.generated < self.max_tokens:
            self._deliver(output, record, fed)
            return
        rest = output.matcher.feed(output.decoder.flush(), armed=past_min)
        if isinstance(rest, StopTextHit):
            self._deliver(output, record, fed + rest.text, pb.FINISH_REASON_STOP, StopMatch.text(rest.stop))
        else:
            self._deliver(output, record, fed + rest + output.matcher.flush(), pb.FINISH_REASON_LENGTH)

    def _deliver(
        self,
        output: Output,
        record: TokenRecord | None,
        text: str,
        reason: pb.FinishReason.ValueType | None = None,
        stop: StopMatch | None = None,
    ) -> None:
        self.stream.put(TokenDelta(output.index, [record] if record is not None else [], text))
        if reason is None:
            return
        output.finished = True
        self.live.remove(output)
        if not self.live:
            self.stream.put(self.usage())
        self.stream.put(OutputFinished(output.index, reason, stop))

    def fail(self, failure: BaseException) -> None:
        """End the request's stream with a terminal failure."""
        self.phase = Phase.DONE
        self.stream.put(self.usage())
        self.stream.fail(failure)


def token_record(model: PseudoModel, row: int, token: int, wanted: LogprobRequest | None) -> TokenRecord:
    """A token with its raw logprob, rank and candidates (when ``wanted``)."""
    if wanted is None:
        return TokenRecord(token, piece(token))
    candidates = _candidates(model, row, wanted.candidates)
    return TokenRecord(token, piece(token), model.logprob(row, token), model.rank(row, token), candidates)


def _candidates(model: PseudoModel, row: int, selection: CandidateSelection | None) -> list[Candidate]:
    if selection is None:
        return []
    if selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N:
        ids: Sequence[int] = model.top(row, selection.top_n)
    elif selection.mode == pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS:
        ids = selection.token_ids
    else:
        ids = range(VOCAB_SIZE)
    logprobs = model.tables.logprobs[row]
    ranks = model.tables.ranks[row]
    return select_candidates(
        selection,
        {i: float(logprobs[i]) for i in ids},
        decode=piece,
        ranks={i: int(ranks[i]) for i in ids},
    )


__all__ = ["MockRequest", "Output", "Phase", "Transferred", "token_record"]
