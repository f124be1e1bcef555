"""``OpenEngineClient(layout="later")``: the later layout's two services, read as the seed's messages.

A gateway on the mock serves both layouts on one port, so every answer through the later layout is compared
with the same question asked through the seed's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway import pb, pb_later
from openengine_gateway.client import (
    IncompatibleServer,
    NotInLayout,
    OpenEngineClient,
    StatusError,
    SyncClient,
    check_compatible,
    text_request,
)
from openengine_gateway.testing import RunningGateway, serve_backends


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[RunningGateway]:
    mock = MockBackend(MockSettings(data_parallel_size=2, decode_time_per_step_s=0.002))
    async with serve_backends([("mock", mock)]) as running:
        yield running


@pytest.fixture
async def clients(gateway: RunningGateway) -> AsyncIterator[tuple[OpenEngineClient, OpenEngineClient]]:
    """A seed-layout client and a later-layout client of the same gateway."""
    async with (
        await OpenEngineClient.connect(gateway.address) as seed,
        await OpenEngineClient.connect(gateway.address, layout="later") as later,
    ):
        yield seed, later


def greedy(**options: object) -> pb.GenerateRequest:
    return text_request(
        "Both layouts", request_id=uuid.uuid4().hex, temperature=0.0, max_tokens=8, ignore_eos=True, **options
    )


async def test_a_generation_is_the_same_in_both_layouts(clients: tuple[OpenEngineClient, OpenEngineClient]) -> None:
    seed, later = clients
    ours, theirs = await seed.generate(greedy(num_sequences=2)), await later.generate(greedy(num_sequences=2))
    assert [o.token_ids for o in theirs.outputs] == [o.token_ids for o in ours.outputs]
    assert [(o.text, o.finish_reason) for o in theirs.outputs] == [(o.text, o.finish_reason) for o in ours.outputs]
    assert theirs.usage == ours.usage and theirs.usage.completion_tokens == 16


async def test_discovery_is_the_same_and_the_identity_is_the_later_layouts(
    clients: tuple[OpenEngineClient, OpenEngineClient],
) -> None:
    seed, later = clients
    identity = await later.identity()
    assert isinstance(identity, pb_later.ServerInfo) and identity.schema_release == pb_later.SCHEMA_RELEASE
    assert later.engine_info == seed.engine_info  # EngineInfo read from GetServerInfo, the seed's own revision
    expected = await seed.model_info("mock")
    expected.ClearField("tasks")  # the later layout serves no tasks
    assert await later.model_info("mock") == expected  # capacity fields back from ServerInfo.capacity
    connector = await seed.kv_connector()
    connector.ClearField("supports_drain")  # the later layout has no Drain
    assert await later.kv_connector() == connector
    assert (await later.load()).attributes == (await seed.load()).attributes


async def test_what_the_later_layout_lacks_is_refused_without_a_call(
    clients: tuple[OpenEngineClient, OpenEngineClient],
) -> None:
    _, later = clients
    for call in (later.embed(pb.EmbedRequest()), later.score(pb.ScoreRequest()), later.classify(pb.ClassifyRequest())):
        with pytest.raises(NotInLayout) as refused:
            await call
        assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED
    for stream in (later.drain(pb.DrainRequest()), later.runtime_events(pb.SubscribeRuntimeEventsRequest())):
        with pytest.raises(NotInLayout, match="the later layout has no"):
            await anext(aiter(stream))
    request = greedy()
    request.metadata["session"] = "s"
    with pytest.raises(NotInLayout, match="metadata has no equivalent") as refused:
        await later.generate(request)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_priority_and_the_rank_reach_the_gateway_as_request_metadata(
    clients: tuple[OpenEngineClient, OpenEngineClient],
) -> None:
    _, later = clients
    request = greedy(data_parallel_rank=1)
    request.priority = 3
    assert (await later.generate(request)).usage.completion_tokens == 8
    with pytest.raises(StatusError, match="data_parallel_rank") as refused:  # the mock has ranks 0 and 1
        await later.generate(greedy(data_parallel_rank=7))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_abort_ends_a_call_read_at_its_own_pace(clients: tuple[OpenEngineClient, OpenEngineClient]) -> None:
    _, later = clients
    request = text_request("Long", request_id=uuid.uuid4().hex, max_tokens=1000, ignore_eos=True)
    call = later.generate_call(request)
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and first.request_id == request.request_id
    assert (await later.abort(pb.AbortRequest(request_id=request.request_id))).status == pb.ABORT_STATUS_ABORTED
    ends = []
    while isinstance(message := await call.read(), pb.GenerateResponse):  # grpc.aio.EOF after the last
        ends += [message.finished.reason] if message.HasField("finished") else []
    assert ends == [pb.FINISH_REASON_CANCELLED] and message is grpc.aio.EOF and call.done()


def test_compatibility_is_checked_against_each_layouts_own_range() -> None:
    later = pb_later.ServerInfo(schema_revision=1, minimum_client_revision=1, schema_release=pb_later.SCHEMA_RELEASE)
    check_compatible(later)
    with pytest.raises(IncompatibleServer, match="was not tested"):
        check_compatible(pb_later.ServerInfo(schema_revision=1, schema_release=pb.SCHEMA_RELEASE))
    with pytest.raises(IncompatibleServer, match="was not tested"):
        check_compatible(pb.EngineInfo(schema_revision=1, schema_release=pb_later.SCHEMA_RELEASE))


async def test_a_server_without_the_later_layout_fails_to_connect_with_unimplemented(gateway: RunningGateway) -> None:
    """The later layout's GetServerInfo is asked at connect: a seed-only server answers UNIMPLEMENTED."""
    server = grpc.aio.server()
    pb.add_OpenEngineServicer_to_server(pb.OpenEngineServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(StatusError) as refused:
            await OpenEngineClient.connect(f"127.0.0.1:{port}", layout="later")
        assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)


async def test_the_sync_client_speaks_the_later_layout(gateway: RunningGateway) -> None:
    def use() -> int:
        with SyncClient(gateway.address, layout="later") as client:
            return client.generate(greedy()).usage.completion_tokens

    assert await asyncio.to_thread(use) == 8  # blocking calls, off the server's loop
