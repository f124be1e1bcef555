"""Who is calling: the transport binds it to the call's task, the core reads it.

A token's requests are its own: ``Abort`` by request id or KV session reaches only what the
same caller started, unless the caller sees every client's (a control token, or any caller
when no tokens are configured). A request another caller owns is answered exactly as one that
does not exist, so a client cannot learn another's ids. The name also keys the per-token
in-flight limit and metrics, and the audit log's lines; it is a token's *name*, never the token.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity of one call, as far as the transport knows it."""

    name: str | None = None
    """The token's name, which owns the requests this caller starts; None without a token (nobody's)."""
    sees_all: bool = True
    """Reaches every client's requests (control scope, or no tokens configured)."""
    peer: str = ""
    """The client's address, as grpc reports it (``ipv4:127.0.0.1:5123``)."""
    subject: str | None = None
    """The client certificate's subject under mutual TLS."""

    def reaches(self, owner: str | None) -> bool:
        """Whether this caller may see or abort a request owned by ``owner``."""
        return self.sees_all or (owner is not None and owner == self.name)

    def describe(self) -> str:
        """For an audit line: the token's name or the certificate's subject, and the peer."""
        who = f"token {self.name!r}" if self.name else f"certificate {self.subject!r}" if self.subject else "anonymous"
        return f"{who} from {self.peer or 'an unknown peer'}"


def scoped_id(owner: str | None, request_id: str) -> str:
    """The id a request of ``owner`` has in the registry and its engine: a token's requests are
    namespaced by its name (``alice/r1``), so that one tenant's ids neither collide with nor reveal
    another's; without a token the client's own id. Token names hold no ``/``."""
    return request_id if owner is None else f"{owner}/{request_id}"


def caller_key(caller: Caller) -> str:
    """Whose share a call spends of a per-caller bound: its token's name, else its client's address
    without the port (one share per host, not per connection)."""
    return caller.name or caller.peer.rpartition(":")[0] or caller.peer


ANYONE = Caller()
"""A caller with no identity that reaches everything: no tokens, or a call the core makes itself."""

_CALLER: ContextVar[Caller] = ContextVar("openengine_caller", default=ANYONE)


def bind_caller(caller: Caller) -> None:
    """Make ``caller`` the identity of everything the current task does from now on."""
    _CALLER.set(caller)


def current_caller() -> Caller:
    """The identity bound to the current task (``ANYONE`` when none was)."""
    return _CALLER.get()


__all__ = ["ANYONE", "Caller", "bind_caller", "caller_key", "current_caller", "scoped_id"]
