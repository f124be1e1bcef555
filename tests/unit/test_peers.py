"""``core.peers`` and ``server.peers``: what one frontend process asks its siblings (``--frontends``).

Two in-process gateways on fake engines stand for two frontend processes: each serves ``Peers`` on
a real unix socket and reaches the other through it, exactly as the frontend processes do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from openengine_gateway import pb, routes_pb
from openengine_gateway.config import AnalysisSection, Config, SplitSection
from openengine_gateway.core.callers import Caller, bind_caller, scoped_id
from openengine_gateway.core.gateway import Gateway
from openengine_gateway.core.peers import freshest, merged_abort, merged_drains
from openengine_gateway.core.registry import ActiveRequest
from openengine_gateway.errors import ConfigurationError, FailedPrecondition, NotFound, Unavailable
from openengine_gateway.reload import RouteReloader
from openengine_gateway.server.peers import SERVICE, PeerClients, PeerServer
from openengine_gateway.server.routes_servicer import RoutesServicer
from openengine_gateway.spi import Load
from prometheus_client import CollectorRegistry

from tests.fakes import FakeBackend, engine_set

TOKEN = "supervisor-secret"


class Frontend:
    """One gateway of the pair, its fake engine, its routes from ``config`` and its ``Peers`` server."""

    def __init__(self, index: int, sockets: list[str], config: Path) -> None:
        self.backend = FakeBackend(model=pb.ModelInfo(supports_lora=True))
        self.siblings = PeerClients([sockets[1 - index]], TOKEN, f"frontend {index + 1} of 2")
        self.gateway = Gateway(engine_set(self.backend), siblings=self.siblings)
        self.gateway.state.started = True
        self.reloader = RouteReloader(self.gateway, config, Config(), command_line=True)
        self.server = PeerServer(self.gateway, self.reloader, CollectorRegistry(), sockets[index], TOKEN)

    def admit(self, request_id: str, *, owner: str | None = None, session: str | None = None) -> ActiveRequest:
        """A request in flight here that ends when stopped, as the generation service's does."""
        registry = self.gateway.registry
        scoped = scoped_id(owner, request_id)  # a token's request is known by its namespaced id
        request = ActiveRequest(scoped, "generate", "m", client_id=request_id, owner=owner, kv_session_id=session)
        request.stop = lambda _reason: registry.release(request)
        registry.admit(request)
        return request


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Frontend, Frontend]]:
    sockets = [str(tmp_path / f"frontend-{index}.sock") for index in range(2)]
    config = tmp_path / "plugins.toml"
    config.write_text("")
    frontends = (Frontend(0, sockets, config), Frontend(1, sockets, config))
    for frontend in frontends:
        await frontend.server.start()
    yield frontends
    for frontend in frontends:
        await frontend.server.stop()
        await frontend.siblings.close()


async def test_abort_reaches_the_sibling_that_owns_the_request(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    request = there.admit("r1")
    response = await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="r1"))
    assert response.status == pb.ABORT_STATUS_ABORTED
    assert request.aborted
    again = await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="r1"))
    assert again.status == pb.ABORT_STATUS_ALREADY_FINISHED
    with pytest.raises(NotFound):
        await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="nobody"))


async def test_a_local_abort_asks_no_sibling(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    await there.server.stop()  # a sibling asked would answer UNAVAILABLE
    here.admit("mine")
    response = await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="mine"))
    assert response.status == pb.ABORT_STATUS_ABORTED


async def test_the_callers_identity_travels_with_the_abort(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    theirs = there.admit("bobs", owner="bob")
    bind_caller(Caller("alice", sees_all=False))
    with pytest.raises(NotFound):  # another token's request reads as unknown, there as here
        await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="bobs"))
    assert not theirs.aborted
    bind_caller(Caller("bob", sees_all=False))
    response = await here.gateway.lifecycle.abort(pb.AbortRequest(request_id="bobs"))
    assert response.status == pb.ABORT_STATUS_ABORTED


async def test_abort_all_requests_counts_every_process(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    here.admit("a")
    there.admit("b")
    there.admit("c")
    response = await here.gateway.lifecycle.abort(pb.AbortRequest(all_requests=pb.AllRequests()))
    assert response.message == "aborted 3 requests"
    assert len(here.gateway.registry) == len(there.gateway.registry) == 0


async def test_kv_session_abort_reaches_the_sibling(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    request = there.admit("attached", session="s1")
    response = await here.gateway.lifecycle.abort(pb.AbortRequest(kv_session=pb.KvSessionRef(session_id="s1")))
    assert response.status == pb.ABORT_STATUS_ABORTED
    assert request.aborted


async def test_drain_waits_for_every_process(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    request = there.admit("running")
    drain = here.gateway.lifecycle.drain(pb.DrainRequest(stop_accepting_new_requests=True))
    started = await anext(drain)
    assert (started.state, started.in_flight_requests) == (pb.DRAIN_STATE_STARTED, 1)
    assert here.gateway.state.draining and there.gateway.state.draining
    there.gateway.registry.release(request)
    rest = [message async for message in drain]
    assert (rest[-1].state, rest[-1].in_flight_requests) == (pb.DRAIN_STATE_COMPLETE, 0)


async def test_drain_after_its_deadline_aborts_the_siblings_requests(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    request = there.admit("running")
    messages = [
        m async for m in here.gateway.lifecycle.drain(pb.DrainRequest(deadline_ms=0, abort_after_deadline=True))
    ]
    assert messages[-1].state == pb.DRAIN_STATE_COMPLETE
    assert request.aborted


async def test_lora_loads_and_unloads_in_every_process(pair: tuple[Frontend, Frontend], tmp_path: Path) -> None:
    here, there = pair
    adapter = pb.LoraAdapter(lora_id=3, lora_name="a", source_path=str(tmp_path))
    await here.gateway.lora.load(pb.LoadLoraRequest(adapter=adapter))
    listed = there.gateway.lora.list(pb.ListLorasRequest())
    assert [a.lora_name for a in listed.adapters] == ["a"]
    assert [(a.lora_id, a.lora_name) for a in there.backend.loaded_loras] == [(3, "a")]
    await there.gateway.lora.unload(pb.UnloadLoraRequest(lora_name="a"))
    assert here.gateway.lora.list(pb.ListLorasRequest()).adapters == []
    assert len(here.backend.unloaded_loras) == 1


async def test_reload_routes_reloads_every_process(pair: tuple[Frontend, Frontend], tmp_path: Path) -> None:
    here, there = pair
    (tmp_path / "plugins.toml").write_text('[[splits]]\nname = "all-of-m"\nengines = { m = 1 }\n')
    reloaded = await RoutesServicer(here.reloader, here.siblings).reload(routes_pb.ReloadRoutesRequest())
    assert [split.name for split in reloaded.routes.splits] == ["all-of-m"]
    assert [split.name for split in there.gateway.routes.splits] == ["all-of-m"]


async def test_a_sibling_refusing_the_reload_is_reported(pair: tuple[Frontend, Frontend], tmp_path: Path) -> None:
    here, there = pair
    (tmp_path / "plugins.toml").write_text('[[splits]]\nname = "all-of-m"\nengines = { m = 1 }\n')
    there.reloader = RouteReloader(there.gateway, None, Config(), command_line=True)  # started without the file
    there.server._reloader = there.reloader
    with pytest.raises(FailedPrecondition, match="reloaded in frontend 1 of 2, not in every frontend"):
        await RoutesServicer(here.reloader, here.siblings).reload(routes_pb.ReloadRoutesRequest())


async def test_load_is_the_freshest_of_the_processes(pair: tuple[Frontend, Frontend]) -> None:
    here, there = pair
    here.backend.load_info = Load(timestamp_unix_nanos=10, running_requests=5)
    there.backend.load_info = Load(timestamp_unix_nanos=20, running_requests=0)
    load = await here.gateway.discovery.load(pb.GetLoadRequest())
    assert (load.timestamp_unix_nanos, load.running_requests) == (20, 0)


async def test_health_names_the_process(pair: tuple[Frontend, Frontend]) -> None:
    here, _ = pair
    health = await here.gateway.lifecycle.health(pb.HealthRequest())
    assert [c.message for c in health.checks if c.name == "grpc"] == ["serving (frontend 1 of 2)"]


async def test_peers_refuse_a_call_without_the_token(pair: tuple[Frontend, Frontend], tmp_path: Path) -> None:
    async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'frontend-1.sock'}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/AbortAll")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(b"reason", metadata=(("x-openengine-peer", "guess"),))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_merged_abort_prefers_aborted_then_finished_then_not_found() -> None:
    aborted = pb.AbortResponse(status=pb.ABORT_STATUS_ABORTED)
    done = pb.AbortResponse(status=pb.ABORT_STATUS_ALREADY_FINISHED)
    missing = NotFound("no such request")
    assert merged_abort([missing, done, aborted]) is aborted
    assert merged_abort([done, missing]) is done
    with pytest.raises(NotFound):
        merged_abort([missing, NotFound("neither there")])
    gone = Unavailable("a frontend process did not answer")
    with pytest.raises(Unavailable):  # nobody said NOT_FOUND for every process
        merged_abort([missing, gone])


def test_freshest_prefers_the_latest_stamp_and_this_process_on_a_tie() -> None:
    unstamped, early, late = pb.LoadInfo(running_requests=1), pb.LoadInfo(timestamp_unix_nanos=1), pb.LoadInfo()
    late.timestamp_unix_nanos = 2
    assert freshest([unstamped, early, late]) is late
    assert freshest([unstamped, pb.LoadInfo()]) is unstamped


async def test_merged_drains_end_with_the_first_error() -> None:
    async def stream(*messages: pb.DrainResponse) -> AsyncIterator[pb.DrainResponse]:
        for message in messages:
            yield message
            await asyncio.sleep(0)

    started = pb.DrainResponse(state=pb.DRAIN_STATE_STARTED, in_flight_requests=1)
    failed = pb.DrainResponse(error=pb.EngineError(message="deadline"))
    merged = [m async for m in merged_drains([stream(started), stream(started, failed)])]
    assert merged[-1].HasField("error")


async def test_a_canary_is_refused_behind_several_frontends(tmp_path: Path) -> None:
    """Each process would judge and step its own share of the traffic."""
    siblings = PeerClients([str(tmp_path / "other.sock")], TOKEN, "frontend 1 of 2")
    engines = engine_set(FakeBackend(), (FakeBackend(), "n"))
    analysis = AnalysisSection(baseline="m", candidate="n")
    split = SplitSection(name="mn", engines={"m": 1, "n": 1}, analysis=analysis)
    with pytest.raises(ConfigurationError, match=r"a split.s analysis .* needs one gateway process"):
        Gateway(engines, splits=[split], siblings=siblings)
    Gateway(engines, splits=[split.model_copy(update={"analysis": None})], siblings=siblings)  # a plain split serves
