"""Generation events → ``GenerateResponse`` messages, with every stream invariant owned here.

``GenerateEncoder`` is the only code that builds generation responses, so no driver can
break the contract's stream rules:

* ``output_index`` is present on every ``TokenOutput`` and ``GenerationFinished`` (index 0 too)
  and ranges over ``0 .. num_sequences - 1``;
* at most one ``PromptOutput``, and only when prompt logprobs were requested;
* exactly one ``GenerationFinished`` per output; nothing for an output after it;
* ``stop_match`` on every STOP;
* ``PrefillReady`` ends a prefill stream, the last ``GenerationFinished`` an aggregated or
  decode stream, a single ``EngineError`` a failed one; nothing follows a terminal event;
* ``usage`` is set on the final response only, cumulative across outputs.

A driver event that would break a rule raises ``ContractViolation``; the gateway reports it
as the terminal ``ERROR_CODE_INTERNAL`` error instead of sending a malformed stream.
"""

from __future__ import annotations

from .. import pb
from ..errors import EngineFailure, enum_name
from ..spi.events import (
    GenerationEvent,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
)
from .generation import kv_session_to_proto


class ContractViolation(Exception):
    """A driver emitted an event the contract does not allow at this point."""


def token_info(record: TokenRecord) -> pb.TokenInfo:
    """One ``TokenInfo``; absent logprob/rank stay absent."""
    info = pb.TokenInfo()
    _fill(info, record)
    return info


def _fill(info: pb.TokenInfo, record: TokenRecord) -> None:
    """Set an empty ``info`` from ``record`` in place.

    The per-token path fills each message where it lives (``tokens.add()``): building one and
    copying it into its parent costs two to three times as much.
    """
    info.token_id = record.token_id
    info.token = record.token
    if record.logprob is not None:
        info.logprob = record.logprob
    if record.rank is not None:
        info.rank = record.rank
    if record.candidates:
        add = info.candidates.add
        for candidate in record.candidates:
            entry = add()
            entry.token_id = candidate.token_id
            entry.logprob = candidate.logprob
            entry.token = candidate.token
            if candidate.rank is not None:
                entry.rank = candidate.rank


def _stop_match(stop: StopMatch) -> pb.StopMatch:
    if stop.stop_token_id is not None:
        return pb.StopMatch(stop_token_id=stop.stop_token_id)
    if stop.stop_text is not None:
        return pb.StopMatch(stop_text=stop.stop_text)
    if stop.eos_token_id is not None:
        return pb.StopMatch(eos_token_id=stop.eos_token_id)
    raise ContractViolation("a STOP finish needs a stop_match (stop token, stop text or EOS)")


class GenerateEncoder:
    """Encodes one request's events; ``done`` turns true at its terminal response."""

    __slots__ = (
        "_completion_tokens",
        "_finished",
        "_num_outputs",
        "_prefill",
        "_prompt_allowed",
        "_prompt_sent",
        "_usage",
        "done",
        "request_id",
    )

    def __init__(self, request_id: str, *, num_outputs: int, prefill: bool, prompt_logprobs: bool) -> None:
        self.request_id = request_id
        self._num_outputs = num_outputs
        self._prefill = prefill
        self._prompt_allowed = prompt_logprobs
        self._prompt_sent = False
        self._finished: set[int] = set()
        self._usage: UsageReport | None = None
        self._completion_tokens = 0
        self.done = False

    @property
    def unfinished_outputs(self) -> list[int]:
        """Output indexes that have not had their ``GenerationFinished`` yet."""
        return [i for i in range(self._num_outputs) if i not in self._finished]

    def encode(self, event: GenerationEvent) -> pb.GenerateResponse | None:
        """The response for ``event``, or None when it produces no message (usage)."""
        if self.done:
            raise ContractViolation(f"event {type(event).__name__} after the terminal response")
        if type(event) is TokenDelta:
            return self._tokens(event)
        if type(event) is UsageReport:
            self._usage = event
            return None
        if type(event) is OutputFinished:
            return self._finish(event)
        if type(event) is PromptTokens:
            return self._prompt(event)
        if type(event) is PrefillDone:
            return self._prefill_ready(event)
        raise ContractViolation(f"unknown generation event {event!r}")

    def _check_index(self, index: int) -> None:
        if self._prefill:
            raise ContractViolation("a prefill request emits no output-scoped events")
        if not 0 <= index < self._num_outputs:
            raise ContractViolation(f"output_index {index} outside 0..{self._num_outputs - 1}")
        if index in self._finished:
            raise ContractViolation(f"output {index} already finished")

    def _tokens(self, event: TokenDelta) -> pb.GenerateResponse | None:
        self._check_index(event.index)
        if not event.tokens and not event.text:
            return None
        self._completion_tokens += len(event.tokens)
        response = pb.GenerateResponse(request_id=self.request_id)
        output = response.token
        output.output_index = event.index  # sets the oneof: the message is built in place, never copied
        output.text = event.text
        add = output.tokens.add
        for record in event.tokens:
            _fill(add(), record)
        return response

    def _prompt(self, event: PromptTokens) -> pb.GenerateResponse:
        if not self._prompt_allowed:
            raise ContractViolation("PromptOutput without a prompt-logprobs request")
        if self._prompt_sent:
            raise ContractViolation("PromptOutput emitted twice")
        self._prompt_sent = True
        response = pb.GenerateResponse(request_id=self.request_id)
        response.prompt.SetInParent()
        add = response.prompt.tokens.add
        for record in event.tokens:
            _fill(add(), record)
        return response

    def _finish(self, event: OutputFinished, *, usage_required: bool = True) -> pb.GenerateResponse:
        self._check_index(event.index)
        if event.reason not in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_CANCELLED):
            reason = enum_name(pb.FinishReason.DESCRIPTOR, event.reason)
            raise ContractViolation(f"finish reason {reason} is not STOP, LENGTH or CANCELLED")
        finished = pb.GenerationFinished(output_index=event.index, reason=event.reason, message=event.message)
        if event.reason == pb.FINISH_REASON_STOP:
            if event.stop is None:
                raise ContractViolation("a STOP finish needs a stop_match")
            finished.stop_match.CopyFrom(_stop_match(event.stop))
        self._finished.add(event.index)
        response = pb.GenerateResponse(request_id=self.request_id, finished=finished)
        if len(self._finished) == self._num_outputs:
            self._final(response, required=usage_required)
        return response

    def _prefill_ready(self, event: PrefillDone) -> pb.GenerateResponse:
        if not self._prefill:
            raise ContractViolation("PrefillReady on a request that is not a prefill")
        if not event.session.session_id:
            raise ContractViolation("PrefillReady needs a KV session id")
        response = pb.GenerateResponse(
            request_id=self.request_id, prefill_ready=pb.PrefillReady(kv_session=kv_session_to_proto(event.session))
        )
        self._final(response, required=True)
        return response

    def error(self, failure: EngineFailure) -> pb.GenerateResponse:
        """The terminal ``EngineError`` response (it replaces any unsent finishes)."""
        if self.done:
            raise ContractViolation("EngineError after the terminal response")
        response = pb.GenerateResponse(request_id=self.request_id, error=failure.to_proto())
        self._final(response, required=False)
        return response

    def cancelled(self, message: str) -> list[pb.GenerateResponse]:
        """Terminal events for a request aborted after acceptance.

        Every open output finishes as CANCELLED; a prefill (which has no outputs) ends with a
        non-retryable ``ERROR_CODE_CANCELLED`` error. After the terminal response there is
        nothing left to end: no event may follow it.
        """
        if self.done:
            return []
        if self._prefill:
            return [self.error(EngineFailure(pb.ERROR_CODE_CANCELLED, message))]
        return [
            self._finish(OutputFinished(i, pb.FINISH_REASON_CANCELLED, message=message), usage_required=False)
            for i in self.unfinished_outputs
        ]

    def _final(self, response: pb.GenerateResponse, *, required: bool) -> None:
        usage = self._usage
        if usage is None:
            if required:
                raise ContractViolation("the driver reported no usage before the final event")
            prompt, completion, cached, reasoning = 0, self._completion_tokens, None, None
        else:
            # A stream cut short (abort, failure) may end before the driver's next report: the
            # tokens already emitted are still part of the request's cumulative usage.
            prompt, completion = usage.prompt_tokens, max(usage.completion_tokens, self._completion_tokens)
            cached, reasoning = usage.cached_prompt_tokens, usage.reasoning_tokens
        message = response.usage
        message.prompt_tokens = prompt
        message.completion_tokens = completion
        message.total_tokens = prompt + completion
        if cached is not None:
            message.cached_prompt_tokens = min(cached, prompt)
        if reasoning is not None:
            message.reasoning_tokens = min(reasoning, completion)
        self.done = True


__all__ = ["ContractViolation", "GenerateEncoder", "token_info"]
