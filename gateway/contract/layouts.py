"""Conversion between the later OpenEngine layout (``pb_later``) and the seed's (``pb``), in all four directions.

The gateway's core speaks the seed's messages; the later layout's edge converts a later request to the
seed's (``*_to_seed``) and the seed's response back (``*_to_later``), and the client and the remote driver
do the opposite. docs/layouts.md has the table.

Most messages are the same on the wire in both layouts (``SAME_WIRE``): they are converted by their bytes.
The others are converted field by field. Nothing is dropped silently from a request: a set field with no
place in the other layout, an ``extra`` key no driver accepts, or a field the receiving layout does not know
(``refuse_unknown_fields``: bytes of the other layout, a newer client) is refused by name with
``InvalidArgument``. A response field the other layout has no place for is left out only where upstream
trimmed it (``EngineError.retry_after_ms``/``details``, the seed's task capabilities) or where it moves to
another message (capacity: ``ModelInfo`` in the seed, ``ServerInfo`` in the later layout).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Literal, TypeVar, get_args

from google.protobuf import descriptor_pool, unknown_fields
from google.protobuf.descriptor import Descriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from .. import pb, pb_later
from ..errors import InvalidArgument

M = TypeVar("M", bound=Message)

PRIORITY_HEADER = "openengine-priority"
"""Request metadata of the later layout: base-10 int32 admission priority (the seed's ``priority``)."""
TARGET_DP_RANK_HEADER = "openengine-target-dp-rank"
"""Request metadata of the later layout: base-10 uint32 rank (the seed's ``kv.data_parallel_rank``)."""
EXTRA_METADATA_PREFIX = "extra."
"""An accepted ``GenerateRequest.extra`` key ``k`` reaches the driver as ``GenerationRequest.metadata``
entry ``extra.k``, its value as JSON (the seed has no ``extra``; its ``metadata`` map is what drivers read)."""

_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)

_ERROR_CODES_TO_LATER = {
    pb.ERROR_CODE_DRAINING: pb_later.ERROR_CODE_OVERLOADED,  # the later layout has no draining: retry elsewhere
    pb.ERROR_CODE_INTERNAL: pb_later.ERROR_CODE_INTERNAL,  # 12 in the seed, 11 in the later layout
}
_ERROR_CODES_TO_SEED = {pb_later.ERROR_CODE_INTERNAL: pb.ERROR_CODE_INTERNAL}
_HEALTH_TO_LATER = {
    pb.HEALTH_STATE_DRAINING: pb_later.HEALTH_STATE_NOT_READY,  # draining admits nothing new
    pb.HEALTH_STATE_NOT_READY: pb_later.HEALTH_STATE_NOT_READY,  # 5 in the seed, 4 in the later layout
}
_HEALTH_TO_SEED = {pb_later.HEALTH_STATE_NOT_READY: pb.HEALTH_STATE_NOT_READY}


def _same_wire(seed: Descriptor, later: Descriptor, seen: set[str]) -> bool:
    """Every field of both has the same number, name, type, label and presence, recursively."""
    if seed.full_name in seen:
        return True
    seen.add(seed.full_name)
    if len(seed.fields) != len(later.fields):
        return False
    for a in seed.fields:
        b = later.fields_by_number.get(a.number)
        if b is None or (a.name, a.type, a.is_repeated, a.has_presence) != (
            b.name,
            b.type,
            b.is_repeated,
            b.has_presence,
        ):
            return False
        if (a.containing_oneof is None) != (b.containing_oneof is None):
            return False
        if (
            a.enum_type is not None
            and b.enum_type is not None
            and [(v.name, v.number) for v in a.enum_type.values] != [(v.name, v.number) for v in b.enum_type.values]
        ):
            return False
        if a.message_type is not None and b.message_type is not None:
            if a.message_type.full_name != b.message_type.full_name:
                return False
            if not _same_wire(a.message_type, b.message_type, seen):
                return False
    return True


def _same_wire_names() -> frozenset[str]:
    default = descriptor_pool.Default()
    names = set()
    for file_name in ("error", "generation", "kv", "lifecycle", "lora", "model", "server"):
        for later in pb_later.POOL.FindFileByName(
            f"openengine_later/v1/{file_name}.proto"
        ).message_types_by_name.values():
            try:
                seed = default.FindMessageTypeByName(later.full_name)
            except KeyError:
                continue
            if _same_wire(seed, later, set()):
                names.add(later.full_name)
    return frozenset(names)


SAME_WIRE = _same_wire_names()
"""Full names of the messages whose bytes mean the same in both layouts (nested types included)."""


def recast(message: Message, cls: type[M]) -> M:
    """``message`` as the same-named message of the other layout; only for ``SAME_WIRE`` types."""
    name = message.DESCRIPTOR.full_name
    if name not in SAME_WIRE or cls.DESCRIPTOR.full_name != name:
        raise TypeError(f"{name} is not the same on the wire in both layouts; convert it field by field")
    return cls.FromString(message.SerializeToString())


def _known(message: Message, cls: type[M]) -> M:
    """A response as ``cls`` of the other layout, by its bytes, less the fields ``cls`` lacks: only for
    messages whose shared field numbers mean the same in both (the callers name what is left out)."""
    result = cls.FromString(message.SerializeToString())
    result.DiscardUnknownFields()
    return result


def _without(message: M, field: str) -> M:
    """A copy of ``message`` with ``field`` cleared."""
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField(field)
    return copy


def refuse_unknown_fields(message: Message, layout: str) -> None:
    """Refuse a message carrying fields (at any depth) that ``layout`` does not define.

    protobuf keeps such fields aside, as it keeps a known number sent with another wire type (the later
    layout's ``kv.cache_salt`` is a string where the seed has ``kv.bypass_prefix_cache``, a bool): a request
    in the other layout's bytes, or from a newer client, is refused here, never half read."""
    where = _unknown_field(message, message.DESCRIPTOR.full_name)
    if where is not None:
        raise InvalidArgument(
            f"{where} is not a field of the {layout} layout's {message.DESCRIPTOR.full_name} (bytes of the other "
            "OpenEngine layout sent to this one's method, or a newer schema): see docs/layouts.md"
        )


def _unknown_field(message: Message, path: str) -> str | None:
    unknown = unknown_fields.UnknownFieldSet(message)
    if len(unknown):
        return f"{path} field number {unknown[0].field_number}"
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.message_type.GetOptions().map_entry:
            values = [v for v in value.values() if isinstance(v, Message)]
        else:
            values = list(value) if descriptor.is_repeated else [value]
        for index, item in enumerate(values):
            found = _unknown_field(item, f"{path}.{descriptor.name}" + (f"[{index}]" if descriptor.is_repeated else ""))
            if found is not None:
                return found
    return None


def _refuse_set(message: Message, fields: Iterable[str], context: str) -> None:
    for name in fields:
        present = (
            message.HasField(name)
            if message.DESCRIPTOR.fields_by_name[name].has_presence
            else bool(getattr(message, name))
        )
        if present:
            raise InvalidArgument(
                f"{context}{name} has no equivalent in the other OpenEngine layout: see docs/layouts.md"
            )


def _header_int(headers: Mapping[str, str], name: str, bounds: tuple[int, int]) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    low, high = bounds
    if not text.strip().lstrip("-").isdecimal() or not low <= int(text) <= high:
        raise InvalidArgument(
            f"request metadata {name} must be a base-10 integer in [{low}, {high}], not {text[:40]!r}"
        )
    return int(text)


# -- requests: later -> seed (the gateway's later edge) ---------------------------------------------


def generate_request_to_seed(
    request: pb_later.GenerateRequest, headers: Mapping[str, str] | None = None, *, accepted_extra: Collection[str] = ()
) -> pb.GenerateRequest:
    """The seed's request for a later one and its request metadata (``openengine-priority``, ``-target-dp-rank``).

    ``extra`` keys are refused by name unless in ``accepted_extra`` (what a driver says it reads; none today),
    which then reach the driver as ``metadata`` entries ``extra.<key>`` holding the value as JSON."""
    refuse_unknown_fields(request, "later")
    seed = pb.GenerateRequest(request_id=request.request_id, model=request.model, lora_name=request.lora_name)
    which = request.WhichOneof("input")
    if which == "prompt":
        seed.prompt = request.prompt
    elif which == "token_ids":
        seed.token_ids.ids.extend(request.token_ids.ids)
    for name in ("sampling", "stopping", "response", "guided"):
        if request.HasField(name):
            getattr(seed, name).CopyFrom(recast(getattr(request, name), type(getattr(seed, name))))
    seed.media.extend(recast(item, pb.MediaItem) for item in request.media)
    if request.HasField("kv"):
        kv = request.kv
        seed.kv.SetInParent()
        if kv.HasField("session"):
            seed.kv.session.CopyFrom(recast(kv.session, pb.KvSessionRef))
        if kv.HasField("bypass_prefix_cache"):
            seed.kv.bypass_prefix_cache = kv.bypass_prefix_cache
        if kv.HasField("cache_salt"):
            seed.kv.cache_salt = kv.cache_salt
    headers = headers or {}
    priority = _header_int(headers, PRIORITY_HEADER, _INT32)
    if priority is not None:
        seed.priority = priority
    rank = _header_int(headers, TARGET_DP_RANK_HEADER, _UINT32)
    if rank is not None:
        seed.kv.data_parallel_rank = rank
    extra = MessageToDict(request.extra) if request.HasField("extra") else {}
    for key in sorted(extra):
        if key not in accepted_extra:
            raise InvalidArgument(
                f"extra.{key} is not a key any engine here accepts (GenerateRequest.extra is refused, not ignored)"
            )
        seed.metadata[EXTRA_METADATA_PREFIX + key] = json.dumps(extra[key])
    return seed


def server_info_request_to_seed(request: pb_later.GetServerInfoRequest) -> pb.GetEngineInfoRequest:
    """``GetServerInfo`` is the seed's ``GetEngineInfo``, renamed (both requests are empty)."""
    refuse_unknown_fields(request, "later")
    return pb.GetEngineInfoRequest()


def request_to_seed(request: Message, cls: type[M]) -> M:
    """A ``SAME_WIRE`` later request as the seed's, after ``refuse_unknown_fields``."""
    refuse_unknown_fields(request, "later")
    return recast(request, cls)


# -- responses: seed -> later (the gateway's later edge) --------------------------------------------


def engine_error_to_later(error: pb.EngineError) -> pb_later.EngineError:
    """The trimmed ``EngineError``: code renumbered, ``retry_after_ms`` and ``details`` left out as upstream did."""
    code = _ERROR_CODES_TO_LATER.get(error.code, error.code)
    return pb_later.EngineError(code=code, message=error.message, retryable=error.retryable)  # type: ignore[arg-type]


def generate_response_to_later(response: pb.GenerateResponse) -> pb_later.GenerateResponse:
    """One stream event; only a terminal error differs between the layouts."""
    if response.WhichOneof("event") != "error":
        return _known(response, pb_later.GenerateResponse)  # no EngineError: every other field is the same
    later = pb_later.GenerateResponse(request_id=response.request_id, error=engine_error_to_later(response.error))
    if response.HasField("usage"):
        later.usage.CopyFrom(recast(response.usage, pb_later.Usage))
    return later


_ConnectorScalar = Literal[
    "enabled", "supports_remote_prefill", "supports_decode_pull", "supports_abort_cleanup", "schema_version"
]
"""The optional scalars ``KvConnectorInfo`` has in both layouts (under different field numbers)."""
_CONNECTOR_SCALARS: tuple[_ConnectorScalar, ...] = get_args(_ConnectorScalar)


def kv_connector_to_later(connector: pb.KvConnectorInfo) -> pb_later.KvConnectorInfo:
    """The connector without ``supports_drain`` (the later layout has no Drain), ``schema_version`` renumbered."""
    later = pb_later.KvConnectorInfo(
        transfer_backend=connector.transfer_backend,
        local_endpoints=[recast(e, pb_later.KvEndpoint) for e in connector.local_endpoints],
        supported_protocols=connector.supported_protocols,
    )
    for name in _CONNECTOR_SCALARS:
        if connector.HasField(name):
            setattr(later, name, getattr(connector, name))
    return later


_Capacity = Literal["kv_block_size", "total_kv_blocks", "max_running_requests", "max_batched_tokens"]
_CAPACITY_FIELDS: tuple[_Capacity, ...] = (
    "kv_block_size",
    "total_kv_blocks",
    "max_running_requests",
    "max_batched_tokens",
)


def server_info_to_later(info: pb.EngineInfo, models: Sequence[pb.ModelInfo]) -> pb_later.ServerInfo:
    """``ServerInfo`` from the seed's ``EngineInfo`` and the served models' ``ModelInfo``.

    The later revision's own identity (``schema_revision``, ``minimum_client_revision``, ``schema_release``);
    the capacity the seed reports per model, where every served model reports the same value."""
    later = pb_later.ServerInfo(
        engine_name=info.engine_name,
        engine_version=info.engine_version,
        engine_role=info.role,  # type: ignore[arg-type]
        instance_id=info.instance_id,
        supported_models=info.supported_models,
        schema_revision=pb_later.SCHEMA_REVISION,
        minimum_client_revision=pb_later.MINIMUM_CLIENT_REVISION,
        schema_release=pb_later.SCHEMA_RELEASE,
    )
    if info.HasField("parallelism"):
        later.parallelism.CopyFrom(_known(info.parallelism, pb_later.ParallelismInfo))
    if info.HasField("kv_connector"):
        later.kv_connector.CopyFrom(kv_connector_to_later(info.kv_connector))
    for name in _CAPACITY_FIELDS:
        values = {getattr(m, name) for m in models if m.HasField(name)}
        if models and len(values) == 1 and all(m.HasField(name) for m in models):
            setattr(later.capacity, name, values.pop())
    return later


def model_info_to_later(info: pb.ModelInfo) -> pb_later.ModelInfo:
    """The model without the seed's capacity fields (``ServerInfo.capacity`` in the later layout) and task
    capabilities (the later layout serves no tasks)."""
    return _known(info, pb_later.ModelInfo)  # fields 6-9 and 27 are the only ones the later ModelInfo lacks


def load_to_later(load: pb.LoadInfo) -> pb_later.LoadInfo:
    """``attributes`` as a Struct of strings (the seed's string map)."""
    later = _known(_without(load, "attributes"), pb_later.LoadInfo)  # a string map does not parse as a Struct
    if load.attributes:
        later.attributes.update(dict(load.attributes))
    return later


def health_to_later(health: pb.HealthResponse) -> pb_later.HealthResponse:
    """States renumbered; the seed's DRAINING is the later layout's NOT_READY."""
    later = pb_later.HealthResponse(state=_HEALTH_TO_LATER.get(health.state, health.state))  # type: ignore[arg-type]
    for check in health.checks:
        later.checks.add(name=check.name, message=check.message, state=_HEALTH_TO_LATER.get(check.state, check.state))
    return later


def kv_events_response_to_later(response: pb.SubscribeKvEventsResponse) -> pb_later.SubscribeKvEventsResponse:
    """A KV event batch (same bytes) or a terminal error (the trimmed ``EngineError``)."""
    if response.WhichOneof("event") == "error":
        return pb_later.SubscribeKvEventsResponse(error=engine_error_to_later(response.error))
    return _known(response, pb_later.SubscribeKvEventsResponse)


# -- requests: seed -> later (the client, the remote driver) ----------------------------------------


def generate_request_to_later(
    request: pb.GenerateRequest,
) -> tuple[pb_later.GenerateRequest, tuple[tuple[str, str], ...]]:
    """The later request for a seed one, and the request metadata that carries ``priority`` and
    ``kv.data_parallel_rank`` in the later layout. ``metadata`` has no place there: refused by name."""
    _refuse_set(request, ("metadata",), "")
    later = pb_later.GenerateRequest(request_id=request.request_id, model=request.model, lora_name=request.lora_name)
    which = request.WhichOneof("input")
    if which == "prompt":
        later.prompt = request.prompt
    elif which == "token_ids":
        later.token_ids.ids.extend(request.token_ids.ids)
    for name in ("sampling", "stopping", "response", "guided"):
        if request.HasField(name):
            getattr(later, name).CopyFrom(recast(getattr(request, name), type(getattr(later, name))))
    later.media.extend(recast(item, pb_later.MediaItem) for item in request.media)
    headers: list[tuple[str, str]] = []
    if request.HasField("priority"):
        headers.append((PRIORITY_HEADER, str(request.priority)))
    if request.HasField("kv"):
        kv = request.kv
        later.kv.SetInParent()
        if kv.HasField("session"):
            later.kv.session.CopyFrom(recast(kv.session, pb_later.KvSessionRef))
        if kv.HasField("bypass_prefix_cache"):
            later.kv.bypass_prefix_cache = kv.bypass_prefix_cache
        if kv.HasField("cache_salt"):
            later.kv.cache_salt = kv.cache_salt
        if kv.HasField("data_parallel_rank"):
            headers.append((TARGET_DP_RANK_HEADER, str(kv.data_parallel_rank)))
    return later, tuple(headers)


def server_info_request_to_later(request: pb.GetEngineInfoRequest) -> pb_later.GetServerInfoRequest:
    """``GetEngineInfo`` is the later layout's ``GetServerInfo`` (both requests are empty)."""
    return pb_later.GetServerInfoRequest()


# -- responses: later -> seed (the client, the remote driver) ---------------------------------------


def engine_error_to_seed(error: pb_later.EngineError) -> pb.EngineError:
    """The seed's ``EngineError`` (INTERNAL renumbered; no retry hint, the later layout has none)."""
    code = _ERROR_CODES_TO_SEED.get(error.code, error.code)
    return pb.EngineError(code=code, message=error.message, retryable=error.retryable)  # type: ignore[arg-type]


def generate_response_to_seed(response: pb_later.GenerateResponse) -> pb.GenerateResponse:
    """One stream event in the seed's layout."""
    if response.WhichOneof("event") != "error":
        return _known(response, pb.GenerateResponse)  # no EngineError: every other field is the same
    seed = pb.GenerateResponse(request_id=response.request_id, error=engine_error_to_seed(response.error))
    if response.HasField("usage"):
        seed.usage.CopyFrom(recast(response.usage, pb.Usage))
    return seed


def kv_connector_to_seed(connector: pb_later.KvConnectorInfo) -> pb.KvConnectorInfo:
    """The seed's connector (``supports_drain`` unknown: the later layout does not say)."""
    seed = pb.KvConnectorInfo(
        transfer_backend=connector.transfer_backend,
        local_endpoints=[recast(e, pb.KvEndpoint) for e in connector.local_endpoints],
        supported_protocols=connector.supported_protocols,
    )
    for name in _CONNECTOR_SCALARS:
        if connector.HasField(name):
            setattr(seed, name, getattr(connector, name))
    return seed


def server_info_to_seed(info: pb_later.ServerInfo) -> pb.EngineInfo:
    """The seed's ``EngineInfo``: the seed's own revision constants, not the later server's (the caller reads
    ``info.capacity`` for ``model_info_to_seed`` and ``info.extra`` itself; ``EngineInfo`` has no place for them)."""
    seed = pb.EngineInfo(
        engine_name=info.engine_name,
        engine_version=info.engine_version,
        role=info.engine_role,  # type: ignore[arg-type]
        instance_id=info.instance_id,
        supported_models=info.supported_models,
        schema_revision=pb.SCHEMA_REVISION,
        minimum_client_revision=pb.MINIMUM_CLIENT_REVISION,
        schema_release=pb.SCHEMA_RELEASE,
    )
    if info.HasField("parallelism"):
        seed.parallelism.CopyFrom(_known(info.parallelism, pb.ParallelismInfo))  # no decode_context_parallel_size
    if info.HasField("kv_connector"):
        seed.kv_connector.CopyFrom(kv_connector_to_seed(info.kv_connector))
    return seed


def model_info_to_seed(info: pb_later.ModelInfo, capacity: pb_later.DeploymentCapacity | None = None) -> pb.ModelInfo:
    """The seed's ``ModelInfo``, its capacity fields from the server's ``capacity`` (``ServerInfo.capacity``).
    ``extra`` has no place in the seed's: the caller reads it from the later message if it wants it."""
    seed = _known(info, pb.ModelInfo)  # field 28 (extra) is the only one the seed's ModelInfo lacks
    if capacity is not None:
        for name in _CAPACITY_FIELDS:
            if capacity.HasField(name):
                setattr(seed, name, getattr(capacity, name))
    return seed


def load_to_seed(load: pb_later.LoadInfo) -> pb.LoadInfo:
    """``attributes`` as strings: a string as itself, any other JSON value as its JSON text."""
    seed = _known(_without(load, "attributes"), pb.LoadInfo)
    for key, value in (MessageToDict(load.attributes) if load.HasField("attributes") else {}).items():
        seed.attributes[key] = value if isinstance(value, str) else json.dumps(value)
    return seed


def health_to_seed(health: pb_later.HealthResponse) -> pb.HealthResponse:
    """States renumbered (NOT_READY is 4 in the later layout, 5 in the seed)."""
    seed = pb.HealthResponse(state=_HEALTH_TO_SEED.get(health.state, health.state))  # type: ignore[arg-type]
    for check in health.checks:
        seed.checks.add(name=check.name, message=check.message, state=_HEALTH_TO_SEED.get(check.state, check.state))
    return seed


def kv_events_response_to_seed(response: pb_later.SubscribeKvEventsResponse) -> pb.SubscribeKvEventsResponse:
    """A KV event batch (same bytes) or a terminal error."""
    if response.WhichOneof("event") == "error":
        return pb.SubscribeKvEventsResponse(error=engine_error_to_seed(response.error))
    return _known(response, pb.SubscribeKvEventsResponse)
