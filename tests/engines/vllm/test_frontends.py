"""``--frontends 2`` on real vLLM: the real command, one engine core, two gateway processes on one port.

One module-scoped command serves the tiny Llama (LoRA and KV events on). Each test's clients open
connections of their own (a local subchannel pool per channel), which the kernel spreads over the
two processes; Health's ``grpc`` check names the process that answers, so a test can hold one
connection per process and prove that what one process was asked reaches the other.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

pytest.importorskip("vllm")
pytest.importorskip("openengine_gateway.conformance.checks")

from openengine_gateway import pb, routes_pb
from openengine_gateway.client import OpenEngineClient
from openengine_gateway.conformance.kit import Rule, Target, all_rules, run_rule
from openengine_gateway.conformance.testing import assert_conforms, target_at

from tests.engines.streams import MODEL, free_port, generate_request
from tests.process import GatewayProcess, gateway_process
from tests.responses import finished

from .conftest import LONG, engine_options

pytestmark = pytest.mark.vllm

T = TypeVar("T")

IN_FLIGHT_S = 60.0
"""How long a test waits to see a LONG request in flight through the other process."""


async def rest(call: Any) -> list[pb.GenerateResponse]:
    """The rest of a stream already read from (``read`` and iteration may not be mixed)."""
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    return responses


def toml_table(name: str, values: dict[str, Any]) -> str:
    """``values`` as a TOML table (and its dict values as sub-tables); None values left out."""
    lines, tables = [f"[{name}]"], []
    for key, value in values.items():
        if isinstance(value, dict):
            tables.append(toml_table(f"{name}.{key}", value))
        elif value is not None:
            lines.append(f"{key} = {json.dumps(value)}")  # JSON's bools, numbers and strings are TOML's
    return "\n".join([*lines, *tables]) + "\n"


@pytest.fixture(scope="module")
def metrics_port() -> int:
    """The supervisor's metrics port."""
    return free_port()


@pytest.fixture(scope="module")
async def frontends(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, metrics_port: int
) -> AsyncIterator[GatewayProcess]:
    """``openengine-gateway --config plugins.toml --frontends 2`` with metrics, until the module ends."""
    directory = tmp_path_factory.mktemp("frontends")
    options = engine_options(model=str(tiny_model), enable_lora=True, max_lora_rank=8, max_loras=2)
    (directory / "plugins.toml").write_text(
        '[plugins]\nallow = ["vllm"]\n\n[[engines]]\nbackend = "vllm"\nserved_model_name = "tiny"\n\n'
        + toml_table("engines.options", options)
    )
    args = ("--config", "plugins.toml", "--frontends", "2", "--metrics-port", str(metrics_port))
    async with gateway_process(*args, cwd=directory, startup_s=300) as gateway:
        yield gateway
        assert await gateway.stop(within_s=90) == 0, gateway.log.read_text()[-4000:]


async def connect(address: str) -> OpenEngineClient:
    """A client on a connection of its own (not shared with the process's other channels)."""
    return await OpenEngineClient.connect(address, channel_options=[("grpc.use_local_subchannel_pool", 1)])


async def process_of(client: OpenEngineClient) -> str:
    """Which frontend process serves ``client``'s connection (Health's ``grpc`` check names it)."""
    health = await client.health()
    (check,) = [check for check in health.checks if check.name == "grpc"]
    assert "frontend" in check.message, check.message
    return check.message


@pytest.fixture
async def pair(frontends: GatewayProcess) -> AsyncIterator[tuple[OpenEngineClient, OpenEngineClient]]:
    """Two clients whose connections two different frontend processes serve."""
    first = await connect(frontends.address)
    owner = await process_of(first)
    clients = [first]
    try:
        for _ in range(40):  # each new connection reaches either process: 2**-40 to miss
            other = await connect(frontends.address)
            clients.append(other)
            if await process_of(other) != owner:
                yield first, other
                return
        pytest.fail("every connection reached the same frontend process")
    finally:
        for client in clients:
            await client.close()


@pytest.fixture(scope="module")
async def target(frontends: GatewayProcess) -> AsyncIterator[Target]:
    async with target_at(frontends.address, MODEL) as target:
        yield target


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.id)
async def test_conformance(target: Target, rule: Rule) -> None:
    assert_conforms(await run_rule(rule, target))


async def abort_as_soon_as_admitted(client: OpenEngineClient, request_id: str) -> pb.AbortResponse:
    """Abort ``request_id`` through ``client`` once its process or a sibling holds it (NOT_FOUND until the
    owner admits it)."""

    async def abort() -> pb.AbortResponse | None:
        try:
            return await client.stub.Abort(pb.AbortRequest(request_id=request_id))
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.NOT_FOUND:
                raise
            return None

    answer = await eventually(abort, lambda answer: answer is not None)
    if answer is None:
        pytest.fail(f"{request_id!r} was never found through the other process")
    return answer


async def test_abort_reaches_the_process_that_owns_the_stream(
    pair: tuple[OpenEngineClient, OpenEngineClient],
) -> None:
    owner, other = pair
    for attempt in range(3):
        request_id = f"cross-process-{attempt}"
        call = owner.stub.Generate(generate_request(request_id, prompt="the quick brown fox", stopping=LONG))
        aborted = await abort_as_soon_as_admitted(other, request_id)
        assert aborted.status == pb.ABORT_STATUS_ABORTED, aborted
        responses = [response async for response in call]
        assert finished(responses)[0].reason == pb.FINISH_REASON_CANCELLED
        again = await other.stub.Abort(pb.AbortRequest(request_id=request_id))
        assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED, again
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await other.stub.Abort(pb.AbortRequest(request_id="nobody-has-this-id"))
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND


async def test_load_shows_the_engine_from_either_process(pair: tuple[OpenEngineClient, OpenEngineClient]) -> None:
    owner, other = pair
    call = owner.stub.Generate(generate_request("load-probe", prompt="the quick brown fox", stopping=LONG))
    await call.read()
    try:
        # the other process learns of the engine's running request from the owner's stats
        if await eventually(other.load, lambda load: load.running_requests >= 1) is None:
            answers = {name: await client.load() for name, client in (("owner", owner), ("other", other))}
            seen = {name: (load.running_requests, load.timestamp_unix_nanos) for name, load in answers.items()}
            pytest.fail(f"GetLoad on the other process never showed the running request: (running, stamp) {seen}")
    finally:
        call.cancel()
    for client in pair:
        if await eventually(client.load, lambda load: load.running_requests == 0) is None:
            pytest.fail("GetLoad kept showing a request after it ended")


async def eventually(ask: Callable[[], Awaitable[T]], holds: Callable[[T], bool]) -> T | None:
    """The first answer of ``ask`` that ``holds`` within ``IN_FLIGHT_S`` (asked every 50 ms), else None."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IN_FLIGHT_S
    while loop.time() < deadline:
        if holds(answer := await ask()):
            return answer
        await asyncio.sleep(0.05)
    return None


async def test_lora_registries_agree(
    pair: tuple[OpenEngineClient, OpenEngineClient], tiny_model: Path, tmp_path: Path
) -> None:
    from .reference import write_lora

    owner, other = pair
    path = write_lora(tiny_model, tmp_path / "adapter")
    adapter = pb.LoraAdapter(lora_id=7, lora_name="shared", source_path=str(path))
    assert not (await owner.load_lora(adapter)).already_loaded
    assert [a.lora_name for a in await other.list_loras()] == ["shared"]
    request = generate_request("lora-on-the-other", prompt="the quick brown fox", lora_name="shared")
    request.stopping.max_tokens = 4
    responses = [response async for response in other.stub.Generate(request)]
    assert finished(responses)[0].reason == pb.FINISH_REASON_LENGTH
    await other.unload_lora("shared")
    assert await owner.list_loras() == []


async def test_kv_events_reach_every_process(pair: tuple[OpenEngineClient, OpenEngineClient]) -> None:
    owner, other = pair
    events = other.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())

    async def stored() -> None:
        async for message in events:
            assert not message.HasField("error"), message
            if any(event.HasField("block_stored") for event in message.batch.events):
                return

    watching = asyncio.create_task(stored())
    await asyncio.sleep(1)  # subscribed to the engine's publisher by now
    prompt = "a prompt no other test sends, long enough to fill a block of thirty-two tokens " * 2
    request = generate_request("kv-events", prompt=prompt)
    request.stopping.max_tokens = 1
    [response async for response in owner.stub.Generate(request)]
    try:
        await asyncio.wait_for(watching, 30)
    finally:
        events.cancel()


def scrape(port: int) -> dict[str, float]:
    """The supervisor's merged metrics page, sample by sample (``name{labels}`` -> value)."""
    from prometheus_client.parser import text_string_to_metric_families

    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_metrics_count_every_process(metrics_port: int, pair: tuple[OpenEngineClient, OpenEngineClient]) -> None:
    port = metrics_port
    key = "openengine_gateway_requests_total{code=OK,rpc=Generate}"
    before = (await asyncio.to_thread(scrape, port)).get(key, 0.0)
    for number, client in enumerate(pair):
        request = generate_request(f"metrics-{number}", prompt="the quick brown fox")
        request.stopping.max_tokens = 2
        [response async for response in client.stub.Generate(request)]
    after = await asyncio.to_thread(scrape, port)
    assert after[key] - before == 2  # one call counted by each process, summed
    assert after["openengine_gateway_serving{}"] == 1
    assert after["openengine_gateway_in_flight_requests{}"] == 0


async def test_reload_routes_reaches_every_process(
    frontends: GatewayProcess, pair: tuple[OpenEngineClient, OpenEngineClient]
) -> None:
    owner, other = pair
    config = frontends.log.parent / "plugins.toml"
    served = config.read_text()
    config.write_text(served + '\n[[splits]]\nname = "tiny-split"\nengines = { tiny = 1 }\n')
    try:
        reloaded = await routes_pb.RoutesStub(owner.channel).ReloadRoutes(routes_pb.ReloadRoutesRequest())
        assert [split.name for split in reloaded.routes.splits] == ["tiny-split"]
        routes = await routes_pb.RoutesStub(other.channel).GetRoutes(routes_pb.GetRoutesRequest())
        assert [split.name for split in routes.splits] == ["tiny-split"]
    finally:
        config.write_text(served)
        await routes_pb.RoutesStub(other.channel).ReloadRoutes(routes_pb.ReloadRoutesRequest())
    assert not (await routes_pb.RoutesStub(owner.channel).GetRoutes(routes_pb.GetRoutesRequest())).splits


async def test_drain_through_one_process_aborts_the_others_requests(
    pair: tuple[OpenEngineClient, OpenEngineClient],
) -> None:
    owner, other = pair
    call = owner.stub.Generate(generate_request("drained", prompt="the quick brown fox", stopping=LONG))
    drain = pb.DrainRequest(deadline_ms=0, abort_after_deadline=True)  # admission goes on (no stop_accepting)
    # a drain before the owner admitted the request finds nothing in flight: drain again
    states = await eventually(lambda: collect_drain(other, drain), lambda states: states[0].in_flight_requests > 0)
    if states is None:
        pytest.fail("no drain through the other process saw the owner's request in flight")
    assert states[0].state == pb.DRAIN_STATE_STARTED and states[0].in_flight_requests == 1, states
    assert states[-1].state == pb.DRAIN_STATE_COMPLETE and states[-1].in_flight_requests == 0, states
    responses = [response async for response in call]
    assert finished(responses)[0].reason == pb.FINISH_REASON_CANCELLED


async def collect_drain(client: OpenEngineClient, request: pb.DrainRequest) -> list[pb.DrainResponse]:
    return [message async for message in client.stub.Drain(request)]
