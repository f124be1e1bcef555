"""Drive targets with the workload and record the receive time of every streamed message.

Targets run one after another, never interleaved: each gets the whole client (its CPU, its event
loop, the network path) to itself, so one engine's load cannot inflate another's latencies. Every
target is connected to before any is measured, so an unreachable one ends the run before it has
cost anything; a target that fails requests only fails its own. The price is that slow drift of
the client machine shows up between targets; the warm-up requests before each measured phase, and
the identical seeded workload, keep that small.

A request counts as completed when its stream ends with every output finished (STOP or LENGTH)
and nothing else: one that ends with an error, is cancelled by the engine (an ``Abort``, a drain)
or ends without its finish is failed, under its error code, ``FINISH_REASON_CANCELLED`` or
``INCOMPLETE_STREAM``.

A fixed concurrency keeps that many requests in flight (each worker sends the next request when
its previous one ends). A request rate sends each request at its arrival time from the workload,
optionally capped by the concurrency. Either way the run stops sending at the request count or,
with a duration, after it, then waits for the requests in flight. At a finite rate the duration
bounds the schedule, not the clock: every request scheduled within it is sent, however late a
slow target or the cap makes it, so every target gets the same ones (at an infinite rate, where
every arrival is at 0, the clock bounds it).

A ``stop`` event (the command sets it on Ctrl-C) ends the run early without losing it: the target
being measured keeps the requests that had ended, is marked interrupted, and the requests still in
flight are cancelled and not counted (they were neither completed nor failed); later targets are
not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .. import pb
from ..client import Layout, OpenEngineClient, StatusError, text_request
from .errors import BenchError
from .progress import Progress
from .records import RequestRecord, Target, TargetRun
from .workload import BenchRequest, Workload

OnDone = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class RunOptions:
    """How requests are sent; the same for every target.

    ``concurrency`` is the number of requests in flight at a fixed concurrency, and an optional
    cap on them at a request rate. At least one of ``num_requests`` and ``duration_s`` bounds
    the run; the first reached ends it.
    """

    concurrency: int | None = 1
    num_requests: int | None = 100
    duration_s: float | None = None
    warmup: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    timeout_s: float | None = 300.0

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("bound the run by a number of requests, a duration, or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("the number of requests must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("the duration must be positive")
        if self.warmup < 0:
            raise ValueError("the number of warm-up requests cannot be negative")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError("the request timeout must be positive")


@dataclass(frozen=True)
class Connection:
    """How to reach every target: bearer token, TLS (system roots unless a CA is given), and the layout spoken."""

    token: str | None = None
    root_certificates: bytes | None = None
    tls: bool = False
    layout: Layout = "seed"


class _Sender:
    """Sends one request and records it (in ``records`` too), on a clock that starts when the sender is made."""

    def __init__(self, client: OpenEngineClient, target: Target, options: RunOptions, on_done: OnDone | None) -> None:
        self._client = client
        self._model = target.model
        self._options = options
        self._on_done = on_done
        self._zero = time.perf_counter()
        self.records: list[RequestRecord] = []
        """Every request that ended, in the order they ended."""

    def clock(self) -> float:
        """Seconds since this sender was made."""
        return time.perf_counter() - self._zero

    async def __call__(self, request: BenchRequest) -> RequestRecord:
        options = self._options
        message = text_request(
            request.prompt,
            model=self._model,
            max_tokens=request.max_tokens,
            temperature=options.temperature,
            ignore_eos=options.ignore_eos,
        )
        record = RequestRecord(request.index, self.clock(), scheduled=request.send_at)
        ended = False
        try:
            async for response in self._client.stream(message, timeout_s=options.timeout_s):
                received = self.clock()
                kind = response.WhichOneof("event")
                if kind == "token" and response.token.tokens:
                    record.message_times.append(received)
                    record.message_tokens.append(len(response.token.tokens))
                    record.token_ids.extend(t.token_id for t in response.token.tokens)
                elif kind == "error":
                    record.error = _error_code(response.error.code)
                    record.error_message = response.error.message
                elif kind == "finished" and response.finished.reason == pb.FINISH_REASON_CANCELLED:
                    record.error = "FINISH_REASON_CANCELLED"
                if response.HasField("usage"):  # set on the final response only
                    ended = True
                    usage = response.usage
                    record.prompt_tokens = usage.prompt_tokens
                    record.completion_tokens = usage.completion_tokens
                    if usage.HasField("cached_prompt_tokens"):
                        record.cached_prompt_tokens = usage.cached_prompt_tokens
        except StatusError as error:
            record.error = error.code.name
            record.error_message = error.details
        if record.error is None and not ended:
            record.error = "INCOMPLETE_STREAM"
        record.ended = self.clock()
        self.records.append(record)
        if self._on_done is not None:
            self._on_done(record)
        return record


async def _fixed_concurrency(
    send: _Sender,
    request_at: Callable[[int], BenchRequest],
    workers: int,
    limit: int | None,
    deadline: float | None,
) -> None:
    indices = itertools.count()

    async def worker() -> None:
        for index in indices:
            if (limit is not None and index >= limit) or (deadline is not None and send.clock() >= deadline):
                return
            await send(request_at(index))

    async with asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(worker())


async def _request_rate(
    send: _Sender, workload: Workload, cap: int | None, limit: int | None, deadline: float | None
) -> None:
    in_flight = asyncio.Semaphore(cap) if cap is not None else None

    async def one(request: BenchRequest) -> None:
        try:
            await send(request)
        finally:
            if in_flight is not None:
                in_flight.release()

    at_once = workload.spec.request_rate == math.inf
    async with asyncio.TaskGroup() as group:
        for index in itertools.count():
            request = workload.request(index)
            assert request.send_at is not None, "a request-rate workload gives every request an arrival time"
            # The schedule, so that a target that falls behind is sent the same requests; the clock
            # only at an infinite rate, where every arrival is at 0.
            end = send.clock() if at_once else request.send_at
            if (limit is not None and index >= limit) or (deadline is not None and end >= deadline):
                break
            delay = request.send_at - send.clock()
            await asyncio.sleep(max(delay, 0))  # at least a turn of the loop, so sent requests run
            if in_flight is not None:
                await in_flight.acquire()
            group.create_task(one(request))


async def run_target(
    client: OpenEngineClient,
    target: Target,
    workload: Workload,
    options: RunOptions,
    on_done: OnDone | None = None,
    stop: asyncio.Event | None = None,
) -> TargetRun:
    """Warm ``target`` up, then run the measured phase; ``on_done`` sees each measured request.

    Setting ``stop`` ends the run early: what ended by then is kept, and the run is marked interrupted.
    """
    if options.warmup:
        warmup = workload.warmup(options.warmup)
        sender = _Sender(client, target, options, None)
        await _until(stop, _fixed_concurrency(sender, warmup.__getitem__, options.concurrency or 1, len(warmup), None))
    sender = _Sender(client, target, options, on_done)
    if stop is not None and stop.is_set():  # interrupted during the warm-up: nothing was measured
        load = None
    elif workload.spec.request_rate is None:
        workers = options.concurrency or 1
        load = _fixed_concurrency(sender, workload.request, workers, options.num_requests, options.duration_s)
    else:
        load = _request_rate(sender, workload, options.concurrency, options.num_requests, options.duration_s)
    interrupted = load is None or not await _until(stop, load)
    duration = sender.clock()
    info = client.engine_info
    engine = f"{info.engine_name} {info.engine_version}" if info is not None else ""
    return TargetRun(target, engine, duration, sorted(sender.records, key=lambda r: r.index), interrupted)


async def _until(stop: asyncio.Event | None, load: Coroutine[Any, Any, None]) -> bool:
    """Run ``load`` to its end (True), or until ``stop`` is set, cancelling it (False)."""
    if stop is None:
        await load
        return True
    task = asyncio.ensure_future(load)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return not task.cancelled()


async def benchmark(
    targets: Sequence[Target],
    workload: Workload,
    options: RunOptions,
    connection: Connection = Connection(),
    *,
    progress: bool = False,
    stop: asyncio.Event | None = None,
) -> list[TargetRun]:
    """Run ``workload`` against every target in turn, with a progress bar on stderr if asked.

    Once ``stop`` is set, the target being measured ends early and later ones are not run.
    """
    runs: list[TargetRun] = []
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for target in targets:
            client = await OpenEngineClient.connect(
                target.address,
                token=connection.token,
                root_certificates=connection.root_certificates,
                tls=connection.tls,
                layout=connection.layout,
                check_compatibility=False,
            )
            clients.append(await stack.enter_async_context(client))
            _check_model(client, target)
        for target, client in zip(targets, clients, strict=True):
            if stop is not None and stop.is_set():
                break
            line = Progress(target.label, options.num_requests, duration_s=options.duration_s, enabled=progress)
            try:
                runs.append(await run_target(client, target, workload, options, line.update, stop))
            finally:
                line.close()
    return runs


def _check_model(client: OpenEngineClient, target: Target) -> None:
    """A target's model must be served before any target is measured: a typo found after the first
    target's run wastes it, and every request to an unknown model fails at once."""
    served = list(client.engine_info.supported_models) if client.engine_info is not None else []
    if target.model and target.model not in served:
        raise BenchError(f"{target.label}: the server serves no model {target.model!r} (it serves {served})")
    if not target.model and len(served) != 1:
        raise BenchError(f"{target.label}: the server serves {served}: name one as HOST:PORT/MODEL")


def _error_code(code: pb.ErrorCode.ValueType) -> str:
    """An ``ErrorCode``'s name; one this client does not know (a newer server's) by its number."""
    try:
        return pb.ErrorCode.Name(code)
    except ValueError:
        return f"ERROR_CODE_{code}"


__all__ = ["Connection", "OnDone", "RunOptions", "benchmark", "run_target"]
