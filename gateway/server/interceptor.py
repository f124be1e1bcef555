"""The one grpc.aio interceptor: authentication, undecodable requests, and per-RPC status counts.

Every call of OpenEngine (either layout) and of the gateway's own Routes service passes through it once:

1. its bearer token is checked from the call's metadata before the request is even parsed
   (``auth``), so an unauthenticated client cannot make the gateway decode a large message;
2. a request over the message limit ends with RESOURCE_EXHAUSTED, counted and logged once at
   WARNING with its peer and size (the transport takes a little more than the limit, so that
   this check, not grpc's invisible one, refuses it); a request that does not parse as its
   message type ends with INVALID_ARGUMENT (gRPC would otherwise answer UNKNOWN with the
   parser's exception);
3. Abort of ``all_requests`` is checked for the control scope once its request is parsed;
4. the caller (its token's name, scope and peer) is bound for the core (``core.callers``), which
   gives a token only its own requests; a PERMISSION_DENIED is written to the audit record;
5. the call's final status code is counted by RPC, and by token name (``on_finished``); a client
   that leaves after its stream's terminal response is counted OK, as the call had finished.

The handler it returns relays the servicer's messages through one thin async-generator
layer, so the per-message cost on a stream is a generator step, nothing more. Without tokens
that handler is built once per method and reused by every call, except for the audited RPCs
(Abort, Drain, LoRA, ReloadRoutes), which bind their caller; with tokens each call gets its own,
bound to its token. ``grpc.health.v1`` needs no token and is not counted; its Check passes the decode
guard and frees a refused request with its call as every RPC does (its Watch ends a refusal without
raising, ``health_watch``); reflection needs any valid token.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health

from .. import pb, pb_later, routes_pb
from ..core.audit import audit
from ..core.callers import Caller, bind_caller
from ..errors import InvalidArgument, PermissionDenied, RequestError, ResourceExhausted
from .auth import Access, Grant, Scope, TokenAuth, request_access, static_access
from .servicer import reject

log = logging.getLogger(__name__)

_PREFIXES = tuple(f"/{name}/" for name in (pb.SERVICE_NAME, *pb_later.SERVICE_NAMES, routes_pb.SERVICE_NAME))
"""The services whose RPCs ``auth.RPC_ACCESS`` names (by method name: the later layout's share the seed's names
for the same RPCs, and are counted under them)."""
_EXEMPT_PREFIX = f"/{health.SERVICE_NAME}/"

_Context = grpc.aio.ServicerContext[Any, Any]
_UnaryStream = Callable[[Any, _Context], AsyncIterator[object]]
_UnaryUnary = Callable[[Any, _Context], Awaitable[object]]

RpcFinished = Callable[[str, str, str | None], None]
"""Called with the RPC name, its final status code name (``OK``, ``CANCELLED``...) and the name of
the token it presented (None without a valid one)."""

AUDITED_RPCS = frozenset({"Abort", "Drain", "LoadLora", "UnloadLora", "ReloadRoutes", "ControlCanary"})
"""RPCs whose caller is bound even without tokens, for the audit record."""


class _Undecodable:
    """What the deserializer hands over instead of a request it could not parse."""

    __slots__ = ("error",)

    def __init__(self, error: DecodeError) -> None:
        self.error = error


class _Oversized:
    """What the deserializer hands over instead of a request over the message limit."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    """Applies ``auth`` (None = open) and ``max_request_bytes`` (None = no limit of its own), and
    reports each OpenEngine call's status to ``on_finished``."""

    def __init__(
        self,
        auth: TokenAuth | None = None,
        on_finished: RpcFinished | None = None,
        *,
        max_request_bytes: int | None = None,
    ) -> None:
        self._auth = auth
        self._on_finished = on_finished or (lambda _rpc, _code, _token: None)
        self._max_bytes = max_request_bytes
        self._relays: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        """OpenEngine method -> its relaying handler, built on the method's first call."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        auth = self._auth
        relay = self._relays.get(method)
        if relay is not None and auth is None:
            return relay  # the common case: no tokens, and the method's handler already built
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if method.startswith(_EXEMPT_PREFIX):  # no token, no count: Check gets the decode guard and ``forget``
            if handler.response_streaming:
                return handler  # Watch writes with context.write and ends a refusal without raising
            relay = self._relays[method] = _relaying(handler, method.rpartition("/")[2], _uncounted, None)
            return relay
        grant = auth.grant(handler_call_details.invocation_metadata) if auth is not None else None
        if not method.startswith(_PREFIXES):
            error = auth.check(Access.DISCOVERY, grant) if auth is not None else None
            return handler if error is None else _rejecting(handler, error, method, grant)
        rpc = method.rpartition("/")[2]
        if auth is not None:
            error = auth.check(static_access(rpc), grant)
            if error is not None:
                self._on_finished(rpc, error.status.name, grant.name if grant is not None else None)
                return _rejecting(handler, error, rpc, grant)
            return _relaying(handler, rpc, self._on_finished, self._max_bytes, _Identity(auth, grant))
        if rpc in AUDITED_RPCS:
            return _relaying(handler, rpc, self._on_finished, self._max_bytes, _Identity(None, None))
        if relay is None:
            relay = self._relays[method] = _relaying(handler, rpc, self._on_finished, self._max_bytes)
        return relay


def _uncounted(_rpc: str, _code: str, _token: str | None) -> None:
    """grpc.health.v1 calls are not OpenEngine calls: they are not counted."""


class _Identity:
    """What the interceptor learnt of a call before its request: the tokens, and its token's grant."""

    __slots__ = ("auth", "grant")

    def __init__(self, auth: TokenAuth | None, grant: Grant | None) -> None:
        self.auth = auth
        self.grant = grant

    def caller(self, rpc: str, context: _Context) -> Caller:
        """The call's identity for the core; a certificate's subject is read only for an audit line."""
        grant = self.grant
        if grant is None:
            subject = _subject(context) if rpc in AUDITED_RPCS else None
            return Caller(peer=context.peer(), subject=subject)
        return Caller(grant.name, sees_all=grant.scope is Scope.CONTROL, peer=context.peer())


def _subject(context: _Context) -> str | None:
    """The client certificate's subject (or common name) under mutual TLS."""
    properties = context.auth_context()
    for key in ("x509_subject", "x509_common_name"):
        for value in properties.get(key, ()):
            return bytes(value).decode("utf-8", "replace")
    return None


def _rejecting(
    handler: grpc.RpcMethodHandler[Any, Any], error: RequestError, rpc: str, grant: Grant | None
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind that ends the call with ``error`` without reading its request."""

    async def refuse(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        del request  # never read: not kept by the frame the abort's traceback holds
        if isinstance(error, PermissionDenied):
            audit(f"PERMISSION_DENIED on {rpc}", _Identity(None, grant).caller(rpc, context))
        await reject(context, error)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


def _relaying(
    handler: grpc.RpcMethodHandler[Any, Any],
    rpc: str,
    on_finished: RpcFinished,
    max_bytes: int | None,
    identity: _Identity | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    """The servicer's handler behind the size and decode guards and status counting; given
    ``identity``, the request-dependent scope check and the caller bound for the core."""
    parse = handler.request_deserializer
    token = identity.grant.name if identity is not None and identity.grant is not None else None

    def deserialize(data: bytes) -> object:
        if max_bytes is not None and len(data) > max_bytes:
            return _Oversized(len(data))  # never parsed
        try:
            return parse(data) if parse is not None else data
        except DecodeError as exc:
            return _Undecodable(exc)

    async def admit(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if isinstance(request, _Oversized):
            log.warning(
                "refused a %d-byte %s request from %s: over the %d-byte message limit",
                request.size,
                rpc,
                context.peer(),
                max_bytes,
            )
            await reject(
                context,
                ResourceExhausted(
                    f"the request is {request.size} bytes, more than this gateway's {max_bytes}-byte message "
                    "limit (--max-message-bytes)"
                ),
            )
        if isinstance(request, _Undecodable):
            await reject(context, InvalidArgument(f"the request is not a valid {rpc} request: {request.error}"))
        if identity is None:
            return
        caller = identity.caller(rpc, context)
        auth = identity.auth
        if auth is not None:
            error = auth.check(request_access(rpc, request), identity.grant)
            if error is not None:
                if isinstance(error, PermissionDenied):
                    audit(f"PERMISSION_DENIED on {rpc}", caller)
                await reject(context, error)
        bind_caller(caller)

    if handler.response_streaming:
        inner_stream = cast(_UnaryStream, handler.unary_stream)  # the grpc stubs type only sync handlers

        async def stream(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[object]:
            code = "OK"
            last: object = None
            try:
                await admit(request, context)
                async for message in inner_stream(request, context):
                    last = message
                    yield message
            except BaseException as exc:
                code = "OK" if _client_left(exc) and _ends_stream(last) else _code(exc, context)
                request = last = None  # the frames below are cleared by forget; these by hand
                forget(exc)
                raise
            finally:
                on_finished(rpc, code, token)

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=deserialize, response_serializer=handler.response_serializer
        )

    inner_unary = cast(_UnaryUnary, handler.unary_unary)

    async def unary(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> object:
        code = "OK"
        try:
            await admit(request, context)
            return await inner_unary(request, context)
        except BaseException as exc:
            code = _code(exc, context)
            request = None  # see stream
            forget(exc)
            raise
        finally:
            on_finished(rpc, code, token)

    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=deserialize, response_serializer=handler.response_serializer
    )


def forget(exc: BaseException) -> None:
    """Clear the locals of every finished frame in ``exc``'s traceback and in those of the exceptions
    it chains. An aborted call's exception sits in a reference cycle (its traceback holds the frames
    that hold it) that only Python's cycle collector frees: without this, the request those frames
    hold (up to the message limit, inflated from a few KiB of gzip) would outlive its call."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__context__ or current.__cause__


_DEADLINE_SKEW_S = 0.1
"""A client ends a call at its own deadline, which the server, having started its clock when the call
arrived, reaches a little later: a cancel this close to the server's deadline is the deadline."""


def _client_left(exc: BaseException) -> bool:
    """Whether ``exc`` is the client leaving (a cancel, its deadline, a closed connection)."""
    return isinstance(exc, asyncio.CancelledError | GeneratorExit)


def _ends_stream(message: object) -> bool:
    """Whether ``message`` is its stream's terminal response by the contract: a client that leaves
    after reading it (before the trailers: Dynamo's worker does) left a call that had finished.

    A Generate stream ends with the one response that carries usage (the last GenerationFinished,
    PrefillReady or EngineError), a drain with COMPLETE or an EngineError. Matched by full name, so
    both wire layouts' messages (each in its own descriptor pool) are recognised.
    """
    if not isinstance(message, Message):
        return False
    name = message.DESCRIPTOR.full_name
    if name == "openengine.v1.GenerateResponse":
        return message.HasField("usage")
    if name == "openengine.v1.DrainResponse":
        return message.WhichOneof("event") == "error" or getattr(message, "state", 0) == pb.DRAIN_STATE_COMPLETE
    return False


def _code(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The status name a call ends with after ``exc`` left its handler."""
    code = context.code()
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        return code.name
    if _client_left(exc):
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= _DEADLINE_SKEW_S else "CANCELLED"
    return "UNKNOWN"


__all__ = ["EdgeInterceptor", "RpcFinished"]
