"""``remote`` in front of a server of the later layout (``Inference`` + ``Control`` only, as TensorRT-LLM's own
OpenEngine server serves): chosen by ``layout``, or found by ``auto``, alone, inside a split and as a mirror's
shadow."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_backends.remote import RemoteSettings
from openengine_gateway import pb, pb_later
from openengine_gateway.client import OpenEngineClient, text_request
from openengine_gateway.config import MirrorSection, SplitSection
from openengine_gateway.server.later_servicer import ControlServicer, InferenceServicer
from openengine_gateway.server.servicer import OpenEngineServicer
from openengine_gateway.testing import serve_backends

from tests.contract.test_mirrors import CountingMock

from .support import remote


@contextlib.asynccontextmanager
async def later_only(engine: MockBackend | None = None, **mock: Any) -> AsyncIterator[str]:
    """A server of the later layout alone (the seed's service answers UNIMPLEMENTED), serving ``engine`` (a mock
    of ``mock`` settings without one) as ``mock`` through this gateway's core; yields its address."""
    async with serve_backends([("mock", engine or MockBackend(MockSettings(**mock)))]) as running:
        seed = OpenEngineServicer(running.gateway)
        server = grpc.aio.server()
        pb_later.add_InferenceServicer_to_server(InferenceServicer(seed, running.gateway), server)
        pb_later.add_ControlServicer_to_server(ControlServicer(seed, running.gateway), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            await server.stop(None)


def greedy(model: str) -> pb.GenerateRequest:
    return text_request(
        "Which engine answers?", model=model, request_id=uuid.uuid4().hex, temperature=0.0, max_tokens=4
    )


async def test_auto_finds_the_later_layout_and_serves_it_as_the_seed_would() -> None:
    async with later_only(seed=2) as address:
        backend = remote(address)
        async with (
            serve_backends([("front", backend), ("direct", MockBackend(MockSettings(seed=2)))]) as front,
            await OpenEngineClient.connect(front.address) as client,
        ):
            assert backend.client.layout == "later"
            relayed, direct = await client.generate(greedy("front")), await client.generate(greedy("direct"))
            assert [o.token_ids for o in relayed.outputs] == [o.token_ids for o in direct.outputs]
            assert relayed.usage == direct.usage
            info = await client.model_info("front")
            assert info.max_context_length == (await client.model_info("direct")).max_context_length
            assert not info.HasField("tasks")  # the later layout serves no tasks: the front advertises none


async def test_auto_keeps_the_seed_layout_where_it_is_served_and_later_can_be_named() -> None:
    async with serve_backends([("mock", MockBackend(MockSettings()))]) as back:
        auto, later = remote(back.address), remote(back.address, layout="later")
        async with serve_backends([("auto", auto), ("later", later)]):
            assert (auto.client.layout, later.client.layout) == ("seed", "later")


async def test_a_seed_remote_named_later_is_refused_at_start() -> None:
    """A remote without the later layout, named in ``layout``, is not answering it: start fails, not a request."""
    server = grpc.aio.server()
    pb.add_OpenEngineServicer_to_server(pb.OpenEngineServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(ConnectionError, match="UNIMPLEMENTED"):
            await remote(f"127.0.0.1:{port}", layout="later").start()
    finally:
        await server.stop(None)


async def test_a_split_over_a_seed_remote_and_a_later_remote_answers_from_both() -> None:
    async with (
        serve_backends([("mock", MockBackend(MockSettings(seed=1)))]) as seed_back,
        later_only(seed=2) as later_back,
        serve_backends(
            [("a", remote(seed_back.address)), ("b", remote(later_back))],
            splits=[SplitSection(name="ab", engines={"a": 1, "b": 1})],
        ) as front,
        await OpenEngineClient.connect(front.address) as client,
    ):
        first = {(await client.generate(greedy(name))).outputs[0].token_ids[0]: name for name in ("a", "b")}
        assert len(first) == 2, "the two mocks' seeds give different first tokens"
        answered = []
        for _ in range(40):  # each its own sticky key, which the later layout has no place for: not relayed
            request = greedy("ab")
            request.metadata["session"] = uuid.uuid4().hex
            answered.append(first[(await client.generate(request)).outputs[0].token_ids[0]])
        assert set(answered) == {"a", "b"}  # 40 coin flips: both sides, but for a 2**-39 chance


async def test_a_later_remote_as_a_mirrors_shadow_gets_every_copy() -> None:
    shadow = CountingMock(MockSettings(seed=2))
    async with (
        serve_backends([("mock", MockBackend(MockSettings(seed=1)))]) as seed_back,
        later_only(shadow) as later_back,
        serve_backends(
            [("a", remote(seed_back.address)), ("b", remote(later_back))],
            mirrors=[MirrorSection(name="a", shadow="b")],
        ) as front,
        await OpenEngineClient.connect(front.address) as client,
    ):
        answers = {(await client.generate(greedy("a"))).outputs[0].token_ids[0] for _ in range(5)}
        deadline = time.monotonic() + 10  # copies run beside the answers: wait for the last to reach the shadow
        while shadow.generations < 5:
            assert time.monotonic() < deadline, f"the shadow got {shadow.generations} of 5 copies"
            await asyncio.sleep(0.02)
    assert len(answers) == 1 and shadow.generations == 5


def test_runtime_events_on_needs_the_seed_layout() -> None:
    with pytest.raises(ValueError, match="runtime_events = on needs the seed layout"):
        RemoteSettings(target="h:1", layout="later", runtime_events="on")
