"""Property-based fuzzing of every OpenEngine RPC over real gRPC, against the mock engine.

Two kinds of input per RPC: messages of the right type whose every field (found from the
protobuf descriptors, so none is hand-picked or forgotten) holds an arbitrary value (any
string, integers across their whole range, NaN and infinities, unknown enum numbers, any
oneof branch, repeated and nested messages), and byte strings that may not parse at all
(arbitrary bytes, truncated or corrupted encodings of real requests) sent through a raw
channel. Bad input must be refused with a status that says so: never INTERNAL or UNKNOWN,
never an INTERNAL ``EngineError``, never an error logged by the gateway or the engine. After
each RPC's run the server still answers, nothing is left in flight, no subscription is left
open and the engine is idle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openengine_backends.mock import MockBackend
from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway

from tests.ops.conftest import Figures
from tests.ops.support import CALLS, engine_idle, gateway, wait_until

METHODS: dict[str, MethodDescriptor] = {method.name: method for method in pb.SERVICE_DESCRIPTOR.methods}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Bounded, with no example database: the whole file runs well under a minute on two cores."""
FUZZ_MESSAGES = settings(FUZZ, max_examples=30)
"""Each example of the message fuzzer is a few requests (one per group of fields, see ``aims``)."""
STREAM_WINDOW_S = 0.02
"""How long an accepted stream is read before the client cancels it (subscriptions never end)."""
REFUSED_AS_INTERNAL = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
MAX_DEPTH = 4
"""Nesting beyond this is left empty (``google.protobuf.Struct`` is recursive)."""
Aim = tuple[tuple[str, ...], ...] | list[tuple[str, ...]]
"""Paths of field names (from the message being built) that a generated message must set."""


# -- messages from descriptors ----------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_WORDS = [
    "",
    "mock",
    "mock-model",
    "x",
    "ops-adapter",
    "/",
    "/tmp",
    "/tmp\x00",
    "a|b",
    "[",
    "\x00",
    "{}",
    "tcp",
    "http://x",
]
"""Strings that reach past the first checks (the served model, a directory, a regex) or break them."""


def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Small values (that pass range checks), the extremes, and anything in between."""
    edges = sorted({lo, hi, max(lo, -1), 0, min(hi, 2**31), min(hi, 2**32)})
    return st.one_of(st.integers(0, 8), st.sampled_from(edges), st.integers(lo, hi))


def scalars(descriptor: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Any value of a non-message field's type."""
    kind = descriptor.type
    if kind in _INT_RANGES:
        return _integers(*_INT_RANGES[kind])
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.one_of(st.floats(0, 2, width=32), st.floats(width=32))
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.one_of(st.floats(0, 2), st.floats())
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        text = st.one_of(st.sampled_from(_WORDS), st.text(max_size=24))
        # Most calls name the served model, so they get past routing to the checks behind it.
        return st.one_of(st.just("mock"), st.just("mock"), text) if descriptor.name == "model" else text
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=32)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert descriptor.enum_type is not None
        known = [value.number for value in descriptor.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))  # proto3 enums are open
    raise AssertionError(f"unhandled field type {kind} of {descriptor.full_name}")


@dataclass
class Coverage:
    """The fields (by full name) that generation has set at least once."""

    set: set[str] = field(default_factory=set)


def reachable(descriptor: Descriptor) -> dict[str, tuple[str, ...]]:
    """Every field a generated message can set, by full name, with the shortest path of field
    names that leads to it (generation goes ``MAX_DEPTH`` messages deep)."""
    found: dict[str, tuple[str, ...]] = {}
    frontier: list[tuple[Descriptor, tuple[str, ...]]] = [(descriptor, ())]
    for _depth in range(MAX_DEPTH):
        deeper = []
        for message, path in frontier:
            for each in message.fields:
                if each.full_name not in found:
                    found[each.full_name] = (*path, each.name)
                    if each.message_type is not None:
                        deeper.append((each.message_type, (*path, each.name)))
        frontier = deeper
    return found


def aims(descriptor: Descriptor) -> list[list[tuple[str, ...]]]:
    """The paths to every reachable field, in groups that one message can set together (paths
    into different members of one oneof go to different groups)."""
    groups: list[list[tuple[str, ...]]] = []
    for path in sorted(reachable(descriptor).values()):
        group = next((g for g in groups if not any(_exclusive(descriptor, path, other) for other in g)), None)
        if group is None:
            groups.append([path])
        else:
            group.append(path)
    return groups


def _exclusive(descriptor: Descriptor, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether the paths part at two members of the same oneof."""
    for x, y in zip(a, b, strict=False):
        first = descriptor.fields_by_name[x]
        if x != y:
            oneof = first.containing_oneof
            return oneof is not None and oneof is descriptor.fields_by_name[y].containing_oneof
        if first.message_type is None:
            return False
        descriptor = first.message_type
    return False


_PRESENT = {"half": st.booleans(), "sparse": st.integers(0, 5).map(lambda n: n == 0)}
"""Whether a field outside the aim is set, by the message's density."""

MUTANTS = 3
"""Mutated valid calls in each example of the message fuzzer."""

Bases = Sequence[Callable[[], Message]]
"""Makers of valid calls of one RPC (``support.CALLS``), for arbitrary fields to be merged over."""


@st.composite
def batches(draw: st.DrawFn, descriptor: Descriptor, coverage: Coverage, bases: Bases) -> list[Message]:
    """One request per group of fields, each with arbitrary fields set besides its group's:
    together they set every field of the request type, in every example. And ``MUTANTS``
    mutants of valid calls (most groups set an option the mock does not advertise, so are
    refused early; mutants get further)."""
    aimed = [draw(grounded(descriptor, coverage, group, bases)) for group in aims(descriptor)]
    return [*aimed, *(draw(mutants(descriptor, coverage, bases)) for _ in range(MUTANTS))]


def requests(descriptor: Descriptor, coverage: Coverage, bases: Bases) -> st.SearchStrategy[Message]:
    """One request aimed at one group of fields, or a mutant of a valid call."""
    groups = aims(descriptor) or [[]]
    aimed = st.sampled_from(groups).flatmap(lambda group: grounded(descriptor, coverage, group, bases))
    return st.one_of(aimed, mutants(descriptor, coverage, bases))


@st.composite
def mutants(draw: st.DrawFn, descriptor: Descriptor, coverage: Coverage, bases: Bases) -> Message:
    """A valid call with a few of its fields replaced or added: it reaches the engine often."""
    base = draw(st.sampled_from(bases))() if bases else _message_class(descriptor)()
    base.MergeFrom(draw(messages(descriptor, coverage, density="sparse")))
    return base


@st.composite
def grounded(draw: st.DrawFn, descriptor: Descriptor, coverage: Coverage, focus: Aim, bases: Bases) -> Message:
    """A message aimed at ``focus``, half the time merged over a valid call: its odd values then
    get past the first checks (a request id, the model) to the ones behind them."""
    message = draw(messages(descriptor, coverage, focus=focus))
    if not bases or not draw(st.booleans()):
        return message
    base = draw(st.sampled_from(bases))()
    base.MergeFrom(message)
    return base


@st.composite
def messages(
    draw: st.DrawFn,
    descriptor: Descriptor,
    coverage: Coverage,
    depth: int = 0,
    focus: Aim = (),
    density: str | None = None,
) -> Message:
    """A message of ``descriptor``'s type with arbitrary fields set (at most one per oneof),
    including every field path in ``focus``."""
    message = _message_class(descriptor)()
    if depth >= MAX_DEPTH:
        return message
    heads = {path[0] for path in focus}
    # Swarm testing: some messages set everything they can, some half their fields, some one or two.
    density = density or draw(st.sampled_from(["dense", "half", "sparse"]))
    dense = density == "dense"
    chosen: dict[str, str] = {}
    for oneof in descriptor.oneofs:
        members = [member.name for member in oneof.fields]
        aimed = [name for name in members if name in heads]
        if aimed:
            chosen[oneof.name] = aimed[0]
        elif dense or draw(_PRESENT[density]):
            chosen[oneof.name] = draw(st.sampled_from(members))
    for each in descriptor.fields:
        owner = each.containing_oneof
        if owner is not None and chosen.get(owner.name) != each.name:
            continue
        wanted = each.name in heads
        if owner is None and not wanted and not dense and not draw(_PRESENT[density]):
            continue
        inner = tuple(path[1:] for path in focus if path[0] == each.name and len(path) > 1)
        if _fill(draw, message, each, coverage, depth, inner if wanted else None):
            coverage.set.add(each.full_name)
    return message


def _fill(
    draw: st.DrawFn,
    message: Message,
    each: FieldDescriptor,
    coverage: Coverage,
    depth: int,
    focus: Aim | None,
) -> bool:
    """Set one field of ``message`` to a drawn value (``focus`` not None: a non-empty one, with
    the rest of the paths inside it); False when it drew an empty repeated field."""
    target = getattr(message, each.name)
    nested = each.message_type
    least = 0 if focus is None else 1
    inner = focus or ()
    if nested is not None and nested.GetOptions().map_entry:
        key, value = nested.fields_by_name["key"], nested.fields_by_name["value"]
        within = tuple(path[1:] for path in inner if path[0] == "value" and len(path) > 1)
        entries = draw(st.lists(st.tuples(scalars(key), _values(value, coverage, depth + 1)), max_size=3 - least))
        if least:
            entries.insert(0, (draw(scalars(key)), draw(_values(value, coverage, depth + 1, within))))
        for k, v in entries:
            if value.message_type is not None:
                target[k].CopyFrom(v)
            else:
                target[k] = v
        if entries:
            coverage.set.update((key.full_name, value.full_name))
        return bool(entries)
    if each.is_repeated:
        items = draw(st.lists(_values(each, coverage, depth + 1), min_size=least, max_size=3))
        if least and nested is not None:
            items[0] = draw(_values(each, coverage, depth + 1, inner))
        if nested is not None:
            for item in items:
                target.add().CopyFrom(item)
        else:
            target.extend(items)
        return bool(items)
    if nested is not None:
        target.CopyFrom(draw(messages(nested, coverage, depth + 1, inner)))
        target.SetInParent()
    else:
        setattr(message, each.name, draw(scalars(each)))
    return True


def _values(each: FieldDescriptor, coverage: Coverage, depth: int, focus: Aim = ()) -> st.SearchStrategy[Any]:
    return messages(each.message_type, coverage, depth, focus) if each.message_type is not None else scalars(each)


def _message_class(descriptor: Descriptor) -> type[Message]:
    return GetMessageClass(descriptor)


def malformed(method: MethodDescriptor, coverage: Coverage, bases: Bases) -> st.SearchStrategy[bytes]:
    """Bytes that are not, or are barely, a request: random, truncated, corrupted, extended, or
    a field of any wire type."""
    encoded = st.one_of(
        requests(method.input_type, coverage, bases).map(lambda m: m.SerializeToString()),
        st.sampled_from(bases).map(lambda make: make().SerializeToString()),
    )

    def truncate(data: bytes, at: int) -> bytes:
        return data[: at % len(data)] if data else data

    def corrupt(data: bytes, at: int, byte: int) -> bytes:
        return data[: at % len(data)] + bytes([byte]) + data[at % len(data) + 1 :] if data else bytes([byte])

    wrong_wire = st.builds(
        lambda number, wire, tail: _varint(number << 3 | wire) + tail,
        st.integers(1, 40),
        st.integers(0, 7),
        st.binary(max_size=12),
    )
    return st.one_of(
        st.binary(max_size=64),
        st.builds(truncate, encoded, st.integers(0, 2**16)),
        st.builds(corrupt, encoded, st.integers(0, 2**16), st.integers(0, 255)),
        wrong_wire,
        st.builds(lambda data, tail: data + tail, encoded, st.binary(min_size=1, max_size=8)),
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


# -- running one input ------------------------------------------------------------------------


@dataclass
class Tally:
    """What the fuzzer tried and saw, over every RPC."""

    messages: int = 0
    malformed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    internal: int = 0
    engine_errors_internal: int = 0
    logged_errors: int = 0
    liveness_checks: int = 0
    leaked: int = 0
    covered: int = 0
    fields: int = 0


TALLY = Tally()


class ErrorLog(logging.Handler):
    """Keeps every ERROR record of the gateway and its engines."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    loggers = [logging.getLogger(name) for name in ("openengine_gateway", "openengine_backends")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@dataclass
class Verdict:
    """How one call ended: its status, and any EngineError it streamed."""

    code: grpc.StatusCode
    engine_errors: list[pb.EngineError]


async def invoke(channel: grpc.aio.Channel, method: MethodDescriptor, request: Message | bytes) -> Verdict:
    """Send ``request`` (a message, or raw bytes) and read the answer; a stream is read for
    ``STREAM_WINDOW_S`` at most and then cancelled by the client."""
    path = f"/{pb.SERVICE_NAME}/{method.name}"
    serialize: Callable[[Any], bytes] | None = None if isinstance(request, bytes) else _serialize
    parse = _message_class(method.output_type).FromString
    if not method.server_streaming:
        unary = channel.unary_unary(path, request_serializer=serialize, response_deserializer=parse)
        try:
            await unary(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            return Verdict(error.code(), [])
        return Verdict(grpc.StatusCode.OK, [])
    stream = channel.unary_stream(path, request_serializer=serialize, response_deserializer=parse)(request, timeout=10)
    errors: list[pb.EngineError] = []
    loop = asyncio.get_running_loop()
    until = loop.time() + STREAM_WINDOW_S
    try:
        while (left := until - loop.time()) > 0:
            message: Any = await asyncio.wait_for(stream.read(), left)  # a response of the method's type
            if message is grpc.aio.EOF:
                break
            if message.HasField("error"):
                errors.append(message.error)
    except TimeoutError:
        pass
    except grpc.aio.AioRpcError as error:
        return Verdict(error.code(), errors)
    finally:
        stream.cancel()
    return Verdict(grpc.StatusCode.OK, errors)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def judge(verdict: Verdict, request: object) -> None:
    """Fail on a status or an error event that blames the server for its input."""
    TALLY.statuses[verdict.code.name] = TALLY.statuses.get(verdict.code.name, 0) + 1
    if verdict.code in REFUSED_AS_INTERNAL:
        TALLY.internal += 1
    internal = [e for e in verdict.engine_errors if e.code == pb.ERROR_CODE_INTERNAL]
    TALLY.engine_errors_internal += len(internal)
    assert verdict.code not in REFUSED_AS_INTERNAL, f"{verdict.code.name} for {request!r}"
    assert not internal, f"EngineError INTERNAL {internal[0].message!r} for {request!r}"


async def settled(running: RunningGateway, backend: MockBackend, error_log: ErrorLog) -> None:
    """The server answers, and nothing the fuzzed calls started is still held anywhere."""
    TALLY.logged_errors += len(error_log.records)
    assert not error_log.records, [record.getMessage() for record in error_log.records]
    stub = pb.OpenEngineStub(running.channel)
    info = await stub.GetEngineInfo(pb.GetEngineInfoRequest(), timeout=5)
    assert info.schema_revision == pb.SCHEMA_REVISION
    health = await stub.Health(pb.HealthRequest(), timeout=5)
    assert health.state in (pb.HEALTH_STATE_READY, pb.HEALTH_STATE_DRAINING), health
    TALLY.liveness_checks += 1
    events = running.gateway.events
    try:
        await wait_until(lambda: len(running.gateway.registry) == 0, what="no request in flight")
        await wait_until(
            lambda: events.kv.subscriber_count + events.runtime.subscriber_count == 0, what="no subscriber"
        )
        await wait_until(lambda: engine_idle(backend), what="the engine idles")
    except AssertionError:
        TALLY.leaked += len(running.gateway.registry)
        raise


@dataclass
class Fuzzed:
    """One RPC's fuzzing target: a gateway on a fresh mock engine, and what generation covered."""

    running: RunningGateway
    backend: MockBackend
    method: MethodDescriptor
    coverage: Coverage
    bases: Bases
    whole_message: bool = False
    """Set by the valid-shaped test: its run must have set every field of the request type."""


@pytest.fixture(params=sorted(METHODS))
async def fuzzed(
    request: pytest.FixtureRequest, error_log: ErrorLog, figures: Figures, tmp_path: Path
) -> AsyncIterator[Fuzzed]:
    """A fresh gateway per RPC (a fuzzed Drain closes admission for good); on teardown, after
    every example, the server must still answer and hold nothing."""
    async with gateway() as running:
        backend = running.gateway.engines.engine("mock").backend
        assert isinstance(backend, MockBackend)
        (load,) = (call for call in CALLS if call.rpc == "LoadLora")
        await pb.OpenEngineStub(running.channel).LoadLora(
            load.request(tmp_path)
        )  # so a LoRA name can resolve, and UnloadLora succeed
        bases = [functools.partial(call.request, tmp_path) for call in CALLS if call.rpc == request.param]
        target = Fuzzed(running, backend, METHODS[request.param], Coverage(), bases)
        yield target
        await settled(running, backend, error_log)
        if target.whole_message:
            wanted = set(reachable(target.method.input_type))
            TALLY.fields += len(wanted)
            TALLY.covered += len(wanted & target.coverage.set)
            assert wanted <= target.coverage.set, f"never set: {sorted(wanted - target.coverage.set)}"
    record(figures)


@FUZZ_MESSAGES
@given(data=st.data())
async def test_valid_shaped_messages(fuzzed: Fuzzed, data: st.DataObject) -> None:
    """Arbitrary values in every field of the request (each example sets each field at least
    once, over a few concurrent calls): refused with a status that blames the input, or served."""
    fuzzed.whole_message = True
    batch = data.draw(batches(fuzzed.method.input_type, fuzzed.coverage, fuzzed.bases), label="requests")
    TALLY.messages += len(batch)
    verdicts = await asyncio.gather(*(invoke(fuzzed.running.channel, fuzzed.method, each) for each in batch))
    for verdict, request in zip(verdicts, batch, strict=True):
        judge(verdict, request)


@FUZZ
@given(data=st.data())
async def test_malformed_bytes(fuzzed: Fuzzed, data: st.DataObject) -> None:
    """Bytes that do not (or only just) parse as the request: INVALID_ARGUMENT when they do not,
    what the message they spell deserves when they do; never INTERNAL."""
    payload = data.draw(malformed(fuzzed.method, fuzzed.coverage, fuzzed.bases), label="payload")
    TALLY.malformed += 1
    judge(await invoke(fuzzed.running.channel, fuzzed.method, payload), payload)


def record(figures: Figures) -> None:
    """The run's figures so far (each fuzzing test adds to the tally)."""
    figures.record("fuzz: valid-shaped messages tried", TALLY.messages)
    figures.record("fuzz: malformed byte strings tried", TALLY.malformed)
    figures.record("fuzz: request fields set at least once", f"{TALLY.covered}/{TALLY.fields}")
    figures.record("fuzz: statuses seen", dict(sorted(TALLY.statuses.items())))
    figures.record("fuzz: INTERNAL/UNKNOWN statuses", TALLY.internal)
    figures.record("fuzz: INTERNAL EngineErrors", TALLY.engine_errors_internal)
    figures.record("fuzz: errors logged by the gateway or engine", TALLY.logged_errors)
    figures.record("fuzz: liveness checks passed after a run (crashes: 0)", TALLY.liveness_checks)
    figures.record("fuzz: in-flight requests leaked", TALLY.leaked)
