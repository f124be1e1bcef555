"""EngineInfo, ModelInfo, LoadInfo and KV connector discovery, built from what drivers report.

Presence is kept exactly: a value a driver did not report stays absent (unknown), and a
reported zero or false is sent as such. With several engines behind one endpoint,
``EngineInfo`` describes the set: see ``engine_info``.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Literal, get_args

from .. import __version__, pb
from ..contract.kv_wire import kv_source_to_proto
from ..engines import Engine, EngineSet
from ..errors import InvalidArgument
from ..spi.kv_events import KvEventSource
from ..spi.results import Load
from .driver_faults import awaited, listed
from .results import load_message

GATEWAY_ENGINE_NAME = "openengine-gateway"
"""``engine_name`` when engines of different kinds share one endpoint."""

_WILDCARDS = {"", "*", "0.0.0.0", "::", "[::]"}


class DiscoveryService:
    """The metadata RPCs."""

    def __init__(self, engines: EngineSet, *, instance_id: str, advertise_host: str) -> None:
        self._engines = engines
        self._instance_id = instance_id
        self._advertise_host = advertise_host

    def engine_info(self, request: pb.GetEngineInfoRequest | None = None) -> pb.EngineInfo:
        """The served engine's identity (or the set's, when several engines are served).

        One engine: its own name, version, role, parallelism and KV connector. Several: the
        common name, version and role when all engines agree, else ``openengine-gateway``, the
        gateway's version and ROLE_UNSPECIFIED; the KV connector only when every engine reports
        the same. Parallelism describes the endpoint's shared rank space (``contract.ranks``):
        ``data_parallel_size`` counts every engine's ranks from ``data_parallel_start_rank`` 0,
        tensor and pipeline sizes are reported when every engine reports the same, and
        ``data_parallel_rank`` is absent. ``supported_models`` always lists every served name
        and alias; ``GetModelInfo`` describes each one exactly.
        """
        engines = list(self._engines)
        first = engines[0].facts
        info = pb.EngineInfo(
            instance_id=self._instance_id,
            supported_models=self._engines.served_names,
            schema_revision=pb.SCHEMA_REVISION,
            minimum_client_revision=pb.MINIMUM_CLIENT_REVISION,
            schema_release=pb.SCHEMA_RELEASE,
        )
        if all(e.facts.engine_name == first.engine_name for e in engines):
            info.engine_name = first.engine_name
            if all(e.facts.engine_version == first.engine_version for e in engines):
                info.engine_version = first.engine_version
        else:
            info.engine_name = GATEWAY_ENGINE_NAME
            info.engine_version = __version__
        if all(e.role == first.role for e in engines):
            info.role = first.role
        if len(engines) == 1:
            info.parallelism.CopyFrom(first.parallelism)
        else:
            info.parallelism.CopyFrom(_shared_parallelism(engines))
        connector = self._common_connector()
        if connector is not None:
            info.kv_connector.CopyFrom(connector)
        return info

    def model_info(self, request: pb.GetModelInfoRequest) -> pb.ModelInfo:
        """The advertised capabilities of one served model (by name or alias); a split's are what
        every engine behind it accepts (``routes``)."""
        if not request.model:
            raise InvalidArgument("model is required")
        return self._engines.route(request.model).model_info

    def kv_connector(self, request: pb.GetKvConnectorInfoRequest | None = None) -> pb.KvConnectorInfo:
        """The KV connector; every field unknown when engines report different connectors."""
        connector = self._common_connector()
        return connector if connector is not None else pb.KvConnectorInfo()

    def _common_connector(self) -> pb.KvConnectorInfo | None:
        connectors = [_connector(e) for e in self._engines]
        return connectors[0] if all(c == connectors[0] for c in connectors) else None

    async def load(self, request: pb.GetLoadRequest) -> pb.LoadInfo:
        """A point-in-time load snapshot; with several engines, see ``_sum_loads``."""
        engines = list(self._engines)
        loads = await self.engine_loads()
        merged = loads[0] if len(loads) == 1 else _sum_loads(engines, loads)
        result = pb.LoadInfo()
        result.CopyFrom(merged)
        result.instance_id = self._instance_id
        if not result.HasField("timestamp_unix_nanos"):
            result.timestamp_unix_nanos = time.time_ns()
        if not request.include_per_rank:
            del result.ranks[:]
        return result

    async def engine_loads(self) -> list[pb.LoadInfo]:
        """Each engine's load as its driver reports it, in engine order."""
        return [
            load_message(await awaited(engine.faults, "load", engine.backend.load(), Load)) for engine in self._engines
        ]

    def kv_event_sources(self, request: pb.GetKvEventSourcesRequest) -> pb.GetKvEventSourcesResponse:
        """Engine-native publishers, with routable hosts and endpoint ranks, filtered by rank."""
        wanted = set(request.data_parallel_ranks)
        response = pb.GetKvEventSourcesResponse()
        for engine in self._engines:
            for source in listed(engine.faults, "kv_event_sources", engine.backend.kv_event_sources, KvEventSource):
                rank = (
                    engine.ranks.to_endpoint(source.data_parallel_rank)
                    if source.data_parallel_rank is not None
                    else None
                )
                if wanted and rank is not None and rank not in wanted:
                    continue
                routable = kv_source_to_proto(source)
                if rank is not None:
                    routable.data_parallel_rank = rank
                if _is_wildcard(routable.endpoint_addr.host):
                    routable.endpoint_addr.host = self._advertise_host
                routable.replay_endpoint = _routable_url(routable.replay_endpoint, self._advertise_host)
                response.sources.append(routable)
        return response


def _connector(engine: Engine) -> pb.KvConnectorInfo:
    if engine.facts.kv_connector is not None:
        return engine.facts.kv_connector
    return pb.KvConnectorInfo(enabled=False)


def _routable_url(url: str, advertise_host: str) -> str:
    """A ``tcp://HOST:PORT`` endpoint (a ZMQ replay socket) with a bind wildcard host replaced,
    like ``endpoint_addr``'s; anything else as it is."""
    scheme, separator, address = url.partition("://")
    host, colon, port = address.rpartition(":")
    if not separator or not colon or not _is_wildcard(host):
        return url
    host = f"[{advertise_host}]" if ":" in advertise_host else advertise_host
    return f"{scheme}://{host}:{port}"


def _is_wildcard(host: str) -> bool:
    if host in _WILDCARDS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


_Summed = Literal[
    "running_requests",
    "queued_requests",
    "active_kv_sessions",
    "used_kv_blocks",
    "total_kv_blocks",
    "running_tokens",
    "waiting_tokens",
    "prefill_batch_size",
    "decode_batch_size",
]
_SUMMED: tuple[_Summed, ...] = get_args(_Summed)


def _sum_loads(engines: list[Engine], loads: list[pb.LoadInfo]) -> pb.LoadInfo:
    """Several engines' loads as one, every part still attributable to its engine.

    Each scalar is the sum when every engine reports it, else absent (unknown). Per-rank
    entries carry endpoint ranks (``contract.ranks``). Engine attributes are prefixed with the
    served model name (``NAME.key``), and ``NAME.ranks`` lists each engine's endpoint ranks.
    """
    merged = pb.LoadInfo()
    for name in _SUMMED:
        if all(load.HasField(name) for load in loads):
            setattr(merged, name, sum(getattr(load, name) for load in loads))
    for engine, load in zip(engines, loads, strict=True):
        for rank in load.ranks:
            added = merged.ranks.add()
            added.CopyFrom(rank)
            if rank.HasField("data_parallel_rank"):
                added.data_parallel_rank = engine.ranks.to_endpoint(rank.data_parallel_rank)
        prefix = engine.served_name
        for key, value in load.attributes.items():
            merged.attributes[f"{prefix}.{key}"] = value
        merged.attributes[f"{prefix}.ranks"] = ",".join(map(str, engine.ranks.ranks))
    return merged


def _shared_parallelism(engines: list[Engine]) -> pb.ParallelismInfo:
    """The rank space several engines share, with the sizes they all agree on."""
    shared = pb.ParallelismInfo(
        data_parallel_size=sum(engine.ranks.width for engine in engines), data_parallel_start_rank=0
    )
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        values = {getattr(e.facts.parallelism, name) if e.facts.parallelism.HasField(name) else None for e in engines}
        if len(values) == 1 and None not in values:
            setattr(shared, name, values.pop())
    return shared


__all__ = ["GATEWAY_ENGINE_NAME", "DiscoveryService"]
