"""Bearer-token authentication with three scopes: inference, observer and control.

A client sends ``authorization: Bearer <token>`` metadata on every call, unary or streaming.
What each RPC needs is one table, ``RPC_ACCESS``, and what each scope reaches another,
``SCOPE_ACCESS``; the docs' threat model is checked against both.

* **Discovery** (GetEngineInfo, GetModelInfo, GetLoad, Health, ListLoras, the KV connector and
  event-source lookups, the gateway's GetRoutes, server reflection): any valid token.
* **Inference** (Generate, Embed, Classify, Score, Abort of one request or KV session): an
  inference or control token. Abort reaches only what the same token started (``core.callers``);
  a control token reaches every client's.
* **Observe** (SubscribeKvEvents, SubscribeRuntimeEvents): an observer or control token. The
  streams carry every client's request ids and token ids, so an inference token never reads them.
* **Control** (Abort of ``all_requests``, Drain, LoadLora, UnloadLora, the gateway's ReloadRoutes and ControlCanary): a
  control token.

A control token grants everything. With no control token configured the inference tokens are
control tokens, so a gateway with one token is simply closed, never open to control; observer
tokens stay observers. A kind of call needs a token once a token that grants it (other than a
control token) is configured, and control calls once any token is: with no tokens configured
nothing is checked. ``grpc.health.v1`` is exempt: load balancers and Kubernetes probes cannot
send tokens, and it reveals only SERVING or NOT_SERVING.

A token file holds one token a line, optionally after a name (``alice s3cr3t``); a token without
one is named by its scope and position (``inference-2``). Names label metrics, log lines and
request ownership; tokens never do. Tokens are kept only as SHA-256 digests and compared with
``hmac.compare_digest`` against every configured digest (no early exit), so neither the
comparison's time nor a log line or repr reveals a token.

A missing or unknown token is UNAUTHENTICATED; a valid token without the scope the call needs is
PERMISSION_DENIED.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .. import pb, pb_later
from ..errors import ConfigurationError, PermissionDenied, RequestError, Unauthenticated

log = logging.getLogger(__name__)

TOKENS_ENV = "OPENENGINE_AUTH_TOKENS"
"""Comma-separated inference tokens, in addition to any token file."""
CONTROL_TOKENS_ENV = "OPENENGINE_CONTROL_TOKENS"
"""Comma-separated control tokens, in addition to any control token file."""
OBSERVER_TOKENS_ENV = "OPENENGINE_OBSERVER_TOKENS"
"""Comma-separated observer tokens, in addition to any observer token file."""


class Scope(enum.Enum):
    """What a token is: the scope it was configured with."""

    INFERENCE = "inference"
    OBSERVER = "observer"
    CONTROL = "control"


class Access(enum.Enum):
    """What a call needs."""

    DISCOVERY = "discovery"
    INFERENCE = "inference"
    OBSERVE = "observe"
    CONTROL = "control"


RPC_ACCESS: Mapping[str, Access] = MappingProxyType(
    {
        "Generate": Access.INFERENCE,
        "Embed": Access.INFERENCE,
        "Classify": Access.INFERENCE,
        "Score": Access.INFERENCE,
        "Abort": Access.INFERENCE,  # of all_requests: CONTROL (request_access)
        "GetEngineInfo": Access.DISCOVERY,
        "GetServerInfo": Access.DISCOVERY,  # the later layout's GetEngineInfo
        "GetModelInfo": Access.DISCOVERY,
        "GetLoad": Access.DISCOVERY,
        "Health": Access.DISCOVERY,
        "ListLoras": Access.DISCOVERY,
        "GetKvConnectorInfo": Access.DISCOVERY,
        "GetKvEventSources": Access.DISCOVERY,
        "SubscribeKvEvents": Access.OBSERVE,
        "SubscribeRuntimeEvents": Access.OBSERVE,
        "Drain": Access.CONTROL,
        "LoadLora": Access.CONTROL,
        "UnloadLora": Access.CONTROL,
        "GetRoutes": Access.DISCOVERY,  # openengine_gateway.v1.Routes, the gateway's own service
        "ReloadRoutes": Access.CONTROL,
        "ControlCanary": Access.CONTROL,
    }
)
"""What each RPC of OpenEngine (both layouts: ``openengine.v1.OpenEngine``, ``Inference`` and ``Control``, whose
shared names mean the same RPC) and of the gateway's own Routes service needs before its request is read."""

SCOPE_ACCESS: Mapping[Scope, frozenset[Access]] = MappingProxyType(
    {
        Scope.INFERENCE: frozenset({Access.DISCOVERY, Access.INFERENCE}),
        Scope.OBSERVER: frozenset({Access.DISCOVERY, Access.OBSERVE}),
        Scope.CONTROL: frozenset(Access),
    }
)
"""What each scope reaches."""

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def static_access(rpc: str) -> Access:
    """What an RPC needs before its request is read (an unknown name: discovery, as reflection)."""
    return RPC_ACCESS.get(rpc, Access.DISCOVERY)


def request_access(rpc: str, request: object) -> Access:
    """What a call needs given its request: Abort of every request is control."""
    if (
        rpc == "Abort"
        and isinstance(request, pb.AbortRequest | pb_later.AbortRequest)  # either layout's
        and request.WhichOneof("target") == "all_requests"
    ):
        return Access.CONTROL
    return static_access(rpc)


@dataclass(frozen=True, slots=True)
class Grant:
    """A valid token's name (never the token) and what it reaches."""

    name: str
    scope: Scope

    def allows(self, access: Access) -> bool:
        """Whether this token may make a call needing ``access``."""
        return access in SCOPE_ACCESS[self.scope]


NamedToken = tuple[str, str]
"""``(name, token)``."""


class TokenAuth:
    """The configured tokens of every scope and the checks made with them.

    Each scope takes tokens (named by scope and position) or ``(name, token)`` pairs."""

    def __init__(
        self,
        inference: Iterable[str | NamedToken] = (),
        control: Iterable[str | NamedToken] = (),
        observer: Iterable[str | NamedToken] = (),
    ) -> None:
        given = {Scope.INFERENCE: list(inference), Scope.CONTROL: list(control), Scope.OBSERVER: list(observer)}
        self._counts = {scope: len(tokens) for scope, tokens in given.items()}
        promote = not given[Scope.CONTROL]  # no control token: inference tokens are control
        self._tokens: list[tuple[bytes, Grant]] = []
        names: set[str] = set()
        for scope, tokens in given.items():
            granted = Scope.CONTROL if promote and scope is Scope.INFERENCE else scope
            for number, entry in enumerate(tokens, 1):
                name, token = entry if isinstance(entry, tuple) else (f"{scope.value}-{number}", entry)
                if not _NAME.fullmatch(name):
                    raise ConfigurationError(f"token name {name[:64]!r} is not 1-64 of A-Z a-z 0-9 _ . : -")
                if name in names:
                    raise ConfigurationError(f"token name {name!r} is used twice; each token needs its own name")
                names.add(name)
                self._tokens.append((_digest(token.encode()), Grant(name, granted)))

    @classmethod
    def from_sources(
        cls,
        *,
        token_files: Sequence[Path] = (),
        control_token_files: Sequence[Path] = (),
        observer_token_files: Sequence[Path] = (),
        environ: Mapping[str, str] = os.environ,
    ) -> TokenAuth | None:
        """Tokens from files (``[name] token`` a line, ``#`` comments) and environment; None when there are none."""
        sources = (
            (token_files, TOKENS_ENV),
            (control_token_files, CONTROL_TOKENS_ENV),
            (observer_token_files, OBSERVER_TOKENS_ENV),
        )
        inference, control, observer = (
            [token for path in files for token in read_tokens(path)] + _split(environ.get(env, ""), env)
            for files, env in sources
        )
        if not inference and not control and not observer:
            return None
        return cls(inference, control, observer)

    def __repr__(self) -> str:
        counts = ", ".join(f"{count} {scope.value}" for scope, count in self._counts.items())
        return f"TokenAuth({counts} tokens)"

    @property
    def tenants_share_control(self) -> bool:
        """Several inference tokens and no control token: each is a control token over the others."""
        return self._counts[Scope.INFERENCE] > 1 and not self._counts[Scope.CONTROL]

    @property
    def names(self) -> list[str]:
        """Every token's name, in configuration order."""
        return [grant.name for _, grant in self._tokens]

    def needs_token(self, access: Access) -> bool:
        """Whether calls needing ``access`` must present a token."""
        counts = self._counts
        inference, observer = counts[Scope.INFERENCE], counts[Scope.OBSERVER]
        if access is Access.DISCOVERY or access is Access.INFERENCE:
            return bool(inference)
        if access is Access.OBSERVE:
            return bool(inference or observer)
        return bool(self._tokens)

    def grant(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Grant | None:
        """What the call's bearer token grants; None when it has no valid token."""
        token = bearer_token(metadata)
        if token is None:
            return None
        presented = _digest(token)
        found: Grant | None = None
        for digest, grant in self._tokens:  # every digest compared, whatever matches first
            if hmac.compare_digest(presented, digest):
                found = grant
        return found

    def check(self, needed: Access, granted: Grant | None) -> RequestError | None:
        """The rejection for a call needing ``needed`` from a client granted ``granted``, if any."""
        if not self.needs_token(needed):
            return None
        if granted is None:
            return Unauthenticated("a valid bearer token is required (metadata 'authorization: Bearer <token>')")
        if not granted.allows(needed):
            reaches = ", ".join(sorted(access.value for access in SCOPE_ACCESS[granted.scope]))
            return PermissionDenied(f"a {granted.scope.value} token reaches {reaches} calls, not {needed.value}")
        return None


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the first ``authorization`` entry when it is a Bearer credential."""
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        return token.encode("latin-1", "replace")
    return None


def read_tokens(path: Path) -> list[str | NamedToken]:
    """The tokens of a token file (``token`` or ``name token`` a line); an unreadable or empty
    file is a configuration error."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot read the token file: {exc}") from None
    if mode & 0o077:
        log.warning("token file %s is readable by other users; chmod 600 it", path)
    lines = [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ConfigurationError(f"{path}: the token file holds no token")
    tokens: list[str | NamedToken] = []
    for number, fields in enumerate(lines, 1):
        if len(fields) > 2:
            raise ConfigurationError(f"{path}: line {number} is not 'token' or 'name token'")  # the line is not echoed
        _validate(fields[-1], f"{path}: token {number}")
        tokens.append((fields[0], fields[1]) if len(fields) == 2 else fields[0])
    return tokens


def _split(value: str, source: str) -> list[str | NamedToken]:
    tokens = [part.strip() for part in value.split(",") if part.strip()]
    for number, token in enumerate(tokens, 1):
        _validate(token, f"${source}: token {number}")
    return list(tokens)


def _validate(token: str, where: str) -> None:
    """A token must be sendable as gRPC metadata: printable ASCII without spaces (not echoed)."""
    if not all("!" <= char <= "~" for char in token):
        raise ConfigurationError(f"{where} has characters other than printable ASCII without spaces")


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


__all__ = [
    "CONTROL_TOKENS_ENV",
    "OBSERVER_TOKENS_ENV",
    "RPC_ACCESS",
    "SCOPE_ACCESS",
    "TOKENS_ENV",
    "Access",
    "Grant",
    "NamedToken",
    "Scope",
    "TokenAuth",
    "bearer_token",
    "read_tokens",
    "request_access",
    "static_access",
]
