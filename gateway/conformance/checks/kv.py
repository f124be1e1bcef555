"""KV connector discovery, engine-native event sources, and the native KV-event stream."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
from collections.abc import AsyncIterator

import grpc

from ... import pb
from ...client import StatusError
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import check_engine_error

SECTION = "KV connector and KV events"
DISAGGREGATION = "Disaggregated serving and KV API"
_WAIT_S = 5.0


def _wildcard(host: str) -> bool:
    """A bind wildcard, in any spelling (``*`` anywhere, an unspecified address), or not a host at all."""
    if host in ("", "0.0.0.0", "::", "[::]") or "*" in host or "://" in host:
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    return False


@rule(
    "kv.connector-info",
    SECTION,
    "GetKvConnectorInfo describes the engine's KV connector, the same KvConnectorInfo that EngineInfo.kv_connector "
    "reports; an absent value means the engine cannot report it.",
)
async def connector_info(target: Target) -> None:
    connector = await target.client.kv_connector()
    info = await target.client.get_engine_info()
    if info.HasField("kv_connector") and info.kv_connector != connector:
        raise CheckFailed(f"EngineInfo.kv_connector {info.kv_connector} differs from GetKvConnectorInfo {connector}")


@rule(
    "kv.sources-routable",
    SECTION,
    "endpoint_addr MUST carry a routable host:port, never a bind wildcard such as * or 0.0.0.0.",
)
async def sources_routable(target: Target) -> None:
    sources = await target.client.kv_event_sources()
    target.require(bool(sources), "engine-native KV event sources")
    for source in sources:
        endpoint = source.endpoint_addr
        if _wildcard(endpoint.host) or endpoint.port == 0:
            raise CheckFailed(f"KvEventSource endpoint_addr {endpoint.host!r}:{endpoint.port} is not routable")


@rule(
    "kv.sources-rank-filter",
    SECTION,
    "GetKvEventSourcesRequest.data_parallel_ranks selects the sources of those ranks; OpenEngine preserves "
    "DP-rank attribution.",
)
async def sources_rank_filter(target: Target) -> None:
    sources = await target.client.kv_event_sources()
    ranked = [s for s in sources if s.HasField("data_parallel_rank")]
    target.require(bool(ranked), "rank-attributed KV event sources")
    rank = ranked[0].data_parallel_rank
    for source in await target.client.kv_event_sources([rank]):
        if source.HasField("data_parallel_rank") and source.data_parallel_rank != rank:
            raise CheckFailed(f"asked for rank {rank}, got a source of rank {source.data_parallel_rank}")


async def _rank(target: Target) -> tuple[int, bool]:
    """The rank a check watches (the model's first), and whether requests must be pinned to it
    (the endpoint has several ranks)."""
    ranks = await target.data_parallel_ranks()
    parallelism = target.engine_info.parallelism
    several = len(ranks) > 1 or (parallelism.HasField("data_parallel_size") and parallelism.data_parallel_size > 1)
    return ranks[0], several


async def _watch(target: Target) -> tuple[AsyncIterator[pb.SubscribeKvEventsResponse], int]:
    """A live subscription to one rank, past its snapshot (so nothing published after it is missed)."""
    rank, _ = await _rank(target)
    request = pb.SubscribeKvEventsRequest(data_parallel_ranks=[rank], include_snapshot=True)
    stream = target.client.kv_events(request, timeout_s=target.timeout_s)
    snapshot = await _next(stream, "the snapshot")
    if snapshot.data_parallel_rank != rank:
        raise CheckFailed(f"subscribed to rank {rank}, the snapshot is of rank {snapshot.data_parallel_rank}")
    return stream, snapshot.sequence_number


async def _next(stream: AsyncIterator[pb.SubscribeKvEventsResponse], what: str) -> pb.KvEventBatch:
    try:
        response = await asyncio.wait_for(anext(stream), _WAIT_S)
    except StatusError as error:
        if error.code == grpc.StatusCode.UNIMPLEMENTED:
            raise NotApplicable("the server has no native KV-event stream (UNIMPLEMENTED)") from None
        raise
    except (TimeoutError, StopAsyncIteration):
        raise NotApplicable(f"no KV event batch arrived within {_WAIT_S:g}s ({what})") from None
    if response.HasField("error"):
        check_engine_error(response.error, "the KV-event stream's EngineError")
        raise CheckFailed(f"the KV-event stream failed: {response.error.message}")
    return response.batch


async def _fill_blocks(target: Target) -> None:
    """Run a prompt no one has sent before that spans several KV blocks of the watched rank."""
    request = target.fresh_prompt(max_tokens=1)
    rank, pin = await _rank(target)
    if pin:
        request.kv.data_parallel_rank = rank
    (await target.run(request)).succeeded()


@rule(
    "kv.sequence-numbers",
    SECTION,
    "OpenEngine preserves batch timestamp, DP-rank attribution, monotonic sequence numbers, replay start sequence ...",
)
async def sequence_numbers(target: Target) -> None:
    target.require_generation()
    stream, number = await _watch(target)
    rank, _ = await _rank(target)
    try:
        last = number
        await _fill_blocks(target)
        await _fill_blocks(target)
        seen = 0
        while seen < 2:
            try:
                batch = await _next(stream, "after two new prompts")
            except NotApplicable:
                if seen:
                    break
                raise
            seen += 1
            if batch.sequence_number <= last:
                raise CheckFailed(f"sequence number {batch.sequence_number} follows {last}; they must increase")
            if batch.data_parallel_rank != rank:
                raise CheckFailed(f"a batch of rank {batch.data_parallel_rank} on a subscription to another rank")
            if batch.timestamp_unix_nanos == 0:
                raise CheckFailed("a KV event batch has no timestamp")
            last = batch.sequence_number
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


@rule(
    "kv.replay",
    SECTION,
    "OpenEngine preserves ... monotonic sequence numbers, replay start sequence: a subscription from "
    "start_sequence_number replays the retained batches from that number on.",
)
async def replay(target: Target) -> None:
    target.require_generation()
    live, _ = await _watch(target)
    try:
        await _fill_blocks(target)
        batch = await _next(live, "after a new prompt")
    finally:
        await live.aclose()  # type: ignore[attr-defined]
    request = pb.SubscribeKvEventsRequest(
        data_parallel_ranks=[batch.data_parallel_rank], start_sequence_number=batch.sequence_number
    )
    replayed = target.client.kv_events(request, timeout_s=target.timeout_s)
    try:
        first = await _next(replayed, "the replay")
    finally:
        await replayed.aclose()  # type: ignore[attr-defined]
    if (first.data_parallel_rank, first.sequence_number) != (batch.data_parallel_rank, batch.sequence_number):
        raise CheckFailed(
            f"replay from {batch.sequence_number} on rank {batch.data_parallel_rank} began with "
            f"{first.sequence_number} on rank {first.data_parallel_rank}"
        )
    if first.events != batch.events:
        raise CheckFailed(f"the replayed batch {first.sequence_number} differs from the one delivered live")


@rule(
    "kv.decode-validates-session",
    DISAGGREGATION,
    "Decode engine validates the session and transfer backend. An accepted prefill failure produces one terminal "
    "EngineError instead.",
)
async def decode_validates_session(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_DECODE)
    request = target.prompt(max_tokens=2)
    request.kv.session.CopyFrom(
        pb.KvSessionRef(
            session_id=f"conformance-{secrets.token_hex(4)}",
            transfer_backend="conformance-no-such-backend",
            endpoints=[pb.KvEndpoint(host="127.0.0.1", port=9, protocol="tcp")],
        )
    )
    try:
        stream = await target.run(request)
    except StatusError:
        return  # rejected before acceptance
    error = stream.error
    if error is None:
        raise CheckFailed("a decode request with an unknown session and transfer backend succeeded")
    if stream.last.WhichOneof("event") != "error" or len(stream.events("error")) != 1:
        raise CheckFailed("the failed decode stream does not end with exactly one EngineError")
    if not stream.last.HasField("usage"):
        raise CheckFailed("the failed decode's terminal EngineError carries no usage (the final response does)")
    check_engine_error(error, "the decode failure")


__all__: list[str] = []
