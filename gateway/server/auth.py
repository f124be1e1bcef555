"""Bearer-token authentication with two scopes: inference and control.

A client sends ``authorization: Bearer <token>`` metadata on every call, unary or streaming.

* **Inference** RPCs (Generate, the tasks, discovery, Health, ListLoras, the event
  subscriptions, Abort of one request or KV session, and server reflection) need an
  inference or a control token once any inference token is configured.
* **Control** RPCs (Abort of ``all_requests``, Drain, LoadLora, UnloadLora) need a control
  token; with no control token configured they fall back to the inference tokens, so a
  gateway with one token is simply closed, never open to control.
* A control token grants inference too: an operator's token can do everything.
* ``grpc.health.v1`` is exempt: load balancers and Kubernetes probes cannot send tokens,
  and it reveals only SERVING or NOT_SERVING.

A missing or unknown token is UNAUTHENTICATED; a valid token without the scope the call
needs is PERMISSION_DENIED. Tokens are kept only as SHA-256 digests and compared with
``hmac.compare_digest`` against every configured digest (no early exit), so neither the
comparison's time nor a log line or repr reveals a token.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .. import pb
from ..config import ConfigError
from ..errors import PermissionDenied, RequestError, Unauthenticated

log = logging.getLogger(__name__)

TOKENS_ENV = "OPENENGINE_AUTH_TOKENS"
"""Comma-separated inference tokens, in addition to any token file."""
CONTROL_TOKENS_ENV = "OPENENGINE_CONTROL_TOKENS"
"""Comma-separated control tokens, in addition to any control token file."""

CONTROL_RPCS = frozenset({"Drain", "LoadLora", "UnloadLora"})
"""RPCs that always need the control scope (Abort needs it only for ``all_requests``)."""


class Scope(enum.IntEnum):
    """What a token may do; a higher scope includes the lower."""

    INFERENCE = 1
    CONTROL = 2


def static_scope(rpc: str) -> Scope:
    """The scope an OpenEngine RPC needs before its request is read."""
    return Scope.CONTROL if rpc in CONTROL_RPCS else Scope.INFERENCE


def request_scope(rpc: str, request: object) -> Scope:
    """The scope a call needs given its request: Abort of every request is control."""
    if rpc == "Abort" and isinstance(request, pb.AbortRequest) and request.WhichOneof("target") == "all_requests":
        return Scope.CONTROL
    return static_scope(rpc)


class TokenAuth:
    """The configured tokens of both scopes and the checks made with them."""

    def __init__(self, inference: Iterable[str] = (), control: Iterable[str] = ()) -> None:
        self._inference = tuple(_digest(token.encode()) for token in inference)
        self._control = tuple(_digest(token.encode()) for token in control)

    @classmethod
    def from_sources(
        cls,
        *,
        token_files: Sequence[Path] = (),
        control_token_files: Sequence[Path] = (),
        environ: Mapping[str, str] = os.environ,
    ) -> TokenAuth | None:
        """Tokens from files (one per line, ``#`` comments) and environment; None when there are none."""
        inference = [token for path in token_files for token in read_tokens(path)]
        control = [token for path in control_token_files for token in read_tokens(path)]
        inference += _split(environ.get(TOKENS_ENV, ""), TOKENS_ENV)
        control += _split(environ.get(CONTROL_TOKENS_ENV, ""), CONTROL_TOKENS_ENV)
        if not inference and not control:
            return None
        return cls(inference, control)

    def __repr__(self) -> str:
        return f"TokenAuth({len(self._inference)} inference, {len(self._control)} control tokens)"

    def needs_token(self, scope: Scope) -> bool:
        """Whether calls needing ``scope`` must present a token."""
        if scope is Scope.INFERENCE:
            return bool(self._inference)
        return bool(self._control or self._inference)

    def grant(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Scope | None:
        """The scope the call's bearer token grants; None when it has no valid token."""
        token = bearer_token(metadata)
        if token is None:
            return None
        presented = _digest(token)
        control = _matches(presented, self._control)
        inference = _matches(presented, self._inference)
        if control or (inference and not self._control):
            return Scope.CONTROL
        return Scope.INFERENCE if inference else None

    def check(self, needed: Scope, granted: Scope | None) -> RequestError | None:
        """The rejection for a call needing ``needed`` from a client granted ``granted``, if any."""
        if not self.needs_token(needed):
            return None
        if granted is None:
            return Unauthenticated("a valid bearer token is required (metadata 'authorization: Bearer <token>')")
        if granted < needed:
            return PermissionDenied("this token may not call control RPCs (Abort of all requests, Drain, LoRA)")
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


def read_tokens(path: Path) -> list[str]:
    """The tokens of a token file; an unreadable or empty file is a configuration error."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the token file: {exc}") from None
    if mode & 0o077:
        log.warning("token file %s is readable by other users; chmod 600 it", path)
    tokens = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise ConfigError(f"{path}: the token file holds no token")
    for number, token in enumerate(tokens, 1):
        _validate(token, f"{path}: token {number}")
    return tokens


def _split(value: str, source: str) -> list[str]:
    tokens = [part.strip() for part in value.split(",") if part.strip()]
    for number, token in enumerate(tokens, 1):
        _validate(token, f"${source}: token {number}")
    return tokens


def _validate(token: str, where: str) -> None:
    """A token must be sendable as gRPC metadata: printable ASCII without spaces (not echoed)."""
    if not all("!" <= char <= "~" for char in token):
        raise ConfigError(f"{where} has characters other than printable ASCII without spaces")


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def _matches(presented: bytes, digests: tuple[bytes, ...]) -> bool:
    """Constant-time membership: every digest is compared, whatever matches first."""
    found = False
    for digest in digests:
        found |= hmac.compare_digest(presented, digest)
    return found


__all__ = [
    "CONTROL_RPCS",
    "CONTROL_TOKENS_ENV",
    "TOKENS_ENV",
    "Scope",
    "TokenAuth",
    "bearer_token",
    "read_tokens",
    "request_scope",
    "static_scope",
]
