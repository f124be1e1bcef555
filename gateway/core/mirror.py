"""Mirrored requests: a copy of a Generate request streamed from a shadow engine and compared.

The client is answered by its own engine alone. The copy runs beside it on a task of its own,
its stream read and dropped; what both sides produced is handed to ``core.agreement`` once both
have ended. The primary never waits for its copy: a copy that fails or lags changes nothing for
the client, and copies past a mirror's ``max_in_flight`` are not made (shed, and counted). When
the primary does not finish (an Abort, a client cancel, a failure, a drain), its copy is
aborted in the shadow engine too.

A copy is validated against the shadow's own capabilities; one the shadow would refuse is not
made (counted as skipped). It has an id of its own, outside the clients' request-id namespace.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import replace

from .. import pb
from ..contract.generation import parse_generate
from ..contract.intersection import token_id_fields
from ..engines import Engine
from ..errors import EngineFailure, InvalidArgument, RequestError, as_failure
from ..routes import Route, share_tokenizer
from ..spi.events import EventStream, GenerationEvent, OutputFinished, TokenDelta
from ..spi.requests import GenerationRequest
from .agreement import Agreement, Side
from .background import BackgroundTasks
from .driver_faults import open_stream

log = logging.getLogger(__name__)


class SideRecorder:
    """What one side streams, recorded as the events pass (``record`` per event)."""

    __slots__ = ("_last", "_pieces", "_start", "error", "finish_reasons", "itl_s", "token_ids", "ttft_s")

    def __init__(self, num_outputs: int) -> None:
        self._start = time.perf_counter()
        self._last = 0.0
        self.token_ids: list[list[int]] = [[] for _ in range(num_outputs)]
        self._pieces: list[list[str]] = [[] for _ in range(num_outputs)]
        self.finish_reasons = [""] * num_outputs
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self.error = ""

    def record(self, event: GenerationEvent) -> None:
        """One event of the side's stream, as it is read."""
        if isinstance(event, TokenDelta):
            now = time.perf_counter()
            if self._last:
                self.itl_s.append(now - self._last)
            else:
                self.ttft_s = now - self._start
            self._last = now
            self.token_ids[event.index].extend(token.token_id for token in event.tokens)
            self._pieces[event.index].append(event.text)
        elif isinstance(event, OutputFinished):
            self.finish_reasons[event.index] = pb.FinishReason.Name(event.reason).removeprefix("FINISH_REASON_")

    @property
    def finished(self) -> bool:
        """Every output has its finish reason."""
        return all(self.finish_reasons)

    def failed(self, failure: EngineFailure) -> None:
        """The side ended with ``failure``."""
        self.error = pb.ErrorCode.Name(failure.code).removeprefix("ERROR_CODE_")

    def side(self, engine: str) -> Side:
        """The record, for ``Agreement``."""
        text = ["".join(pieces) for pieces in self._pieces]
        return Side(engine, self.token_ids, text, self.finish_reasons, self.ttft_s, self.itl_s, self.error)


class ShadowCopy:
    """One mirrored request: the primary's recorder, and the copy's run on the shadow engine."""

    def __init__(
        self,
        mirroring: Mirroring,
        primary: Engine,
        shadow: Engine,
        request: GenerationRequest,
        *,
        same_tokenizer: bool,
        bound: tuple[str, str],
    ) -> None:
        self.primary = SideRecorder(request.sampling.num_sequences)
        """Fed by the core with the primary's events as they are sent."""
        self._mirroring = mirroring
        self.pair = (primary.served_name, shadow.served_name)
        """(primary engine, shadow engine), as ``Agreement`` labels them."""
        self.bound = bound
        """(route, shadow engine): what the mirror's ``max_in_flight`` counts copies by."""
        self._shadow_engine = shadow
        self._request = request
        self._same_tokenizer = same_tokenizer
        self._primary_finished = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    def start(self, background: BackgroundTasks) -> None:
        self._task = background.spawn(self._run(), f"mirror {self._request.request_id}")

    def primary_ended(self, *, finished: bool) -> None:
        """The primary's stream is over: compare once the copy ends, or abort the copy."""
        if self._primary_finished.done():
            return
        self._primary_finished.set_result(finished)
        if not finished:
            self._mirroring.agreement.cancelled(*self.pair)
            if self._task is not None:
                self._task.cancel()

    def cancel(self) -> None:
        """Abort the copy (the gateway is stopping)."""
        self.primary_ended(finished=False)

    async def _run(self) -> None:
        try:
            shadow = await self._stream()
            if await self._primary_finished:
                sampling = self._request.sampling
                greedy = sampling.temperature == 0 or sampling.top_k == 1
                self._mirroring.agreement.compared(
                    self.primary.side(self.pair[0]),
                    shadow.side(self.pair[1]),
                    greedy=greedy,
                    same_tokenizer=self._same_tokenizer,
                )
        finally:
            self._mirroring.ended(self)

    async def _stream(self) -> SideRecorder:
        """Read the copy's stream to its end; abort it in the engine unless it finished."""
        engine, request = self._shadow_engine, self._request
        recorder = SideRecorder(request.sampling.num_sequences)
        events: EventStream | None = None
        try:
            events = open_stream(engine.backend, engine.faults, request)
            async for event in events:
                recorder.record(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broad on purpose: a failing shadow is recorded, never raised
            recorder.failed(as_failure(exc))
        finally:
            if events is not None:
                if not recorder.finished:
                    events.cancel()
                events.detach()
            if not recorder.finished:
                self._mirroring.abort_in_shadow(engine, request.request_id)
        return recorder


class Mirroring:
    """Every running copy, bounded per mirror; one per gateway."""

    def __init__(self, background: BackgroundTasks, agreement: Agreement) -> None:
        self.agreement = agreement
        self._background = background
        self._in_flight: Counter[tuple[str, str]] = Counter()
        """Running copies per (route, shadow engine)."""
        self._copies: set[ShadowCopy] = set()

    def copy(self, route: Route, engine: Engine, request: pb.GenerateRequest) -> ShadowCopy | None:
        """A running copy of ``request`` (accepted for ``engine`` on ``route``), or None when the route is
        not mirrored, ``engine`` is the shadow (a split's own engine shadowing the others), this request is not
        sampled, the mirror is full (shed) or the shadow would refuse it."""
        mirror = route.mirror
        if mirror is None or mirror.shadow is engine or not mirror.sampled():
            return None
        shadow = mirror.shadow
        pair = (engine.served_name, shadow.served_name)
        bound = (route.name, shadow.served_name)  # a split's engines share their mirror's bound
        if self._in_flight[bound] >= mirror.max_in_flight:
            self.agreement.shed(*pair)
            return None
        same_tokenizer = share_tokenizer((engine, shadow))
        try:
            if not same_tokenizer and token_id_fields(request):
                raise InvalidArgument("its token ids mean something else on the shadow")
            parsed = parse_generate(request, served_name=shadow.served_name, model=shadow.model_info, role=shadow.role)
        except RequestError as refused:
            self.agreement.skipped(*pair)
            log.debug("not mirrored to %s: %s", shadow.served_name, refused)
            return None
        parsed = replace(parsed, request_id=f"mirror-{uuid.uuid4().hex}", data_parallel_rank=None)
        copy = ShadowCopy(self, engine, shadow, parsed, same_tokenizer=same_tokenizer, bound=bound)
        self._in_flight[bound] += 1
        self._copies.add(copy)
        copy.start(self._background)
        return copy

    def ended(self, copy: ShadowCopy) -> None:
        self._copies.discard(copy)
        self._in_flight[copy.bound] -= 1

    def abort_in_shadow(self, engine: Engine, request_id: str) -> None:
        """Tell the shadow engine to drop a copy that did not finish."""
        self._background.spawn(engine.backend.abort(request_id), f"abort {request_id}")

    def close(self) -> None:
        """Abort every running copy (the gateway is stopping)."""
        for copy in list(self._copies):
            copy.cancel()


__all__ = ["Mirroring", "ShadowCopy", "SideRecorder"]
