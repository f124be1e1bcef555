"""Prefill → decode KV handoff over a small loopback TCP protocol.

A prefill engine keeps each finished prefill's blocks in a ``SessionStore`` and serves
them from a TCP endpoint. A decode engine ``pull``s a session by id: one JSON line asks,
one JSON line answers with the prefilled token ids and adapter. The session is released
once it has been sent, aborted, or left unpulled past its timeout, so the prefill engine
never leaks blocks. Failures on the decode side are ``EngineFailure``s: an unknown session
is KV_SESSION_NOT_FOUND, anything else on the wire is a retryable KV_TRANSFER_FAILED.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass

from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import Endpoint, HeldKvSessions, KvSession

from .events import runtime_event
from .request import Transferred

TRANSFER_BACKEND = "mock-tcp"
PROTOCOL = "tcp"
_LINE_LIMIT = 16 * 1024 * 1024
_WILDCARDS = frozenset({"", "*", "0.0.0.0", "::", "[::]"})


@dataclass(eq=False, slots=True)
class HeldSession:
    """A prefilled session waiting for its decode engine."""

    session_id: str
    token_ids: tuple[int, ...]
    lora_name: str
    release: Callable[[], None]
    """Frees the session's blocks in the engine that owns them."""


class SessionStore:
    """The prefill role's held sessions and the TCP server that hands them out."""

    def __init__(self, host: str, port: int, timeout_s: float, publish: Callable[[pb.RuntimeEvent], None]) -> None:
        self._host = host
        self._advertised = host
        self._port = port
        self._publish = publish
        self._sessions: HeldKvSessions[HeldSession] = HeldKvSessions(expire_after_s=timeout_s)
        self._server: asyncio.Server | None = None

    @property
    def endpoint(self) -> Endpoint:
        """Where decode engines connect (the bound port and this host's name once started)."""
        return Endpoint(self._advertised, self._port, PROTOCOL)

    @property
    def listening(self) -> bool:
        """Whether the transfer server is serving."""
        return self._server is not None and self._server.is_serving()

    def __len__(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        """Bind the transfer server (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=_LINE_LIMIT)
        self._port = self._server.sockets[0].getsockname()[1]
        if self._host in _WILDCARDS:  # where to listen, not where another machine can connect (looked up once)
            self._advertised = await asyncio.to_thread(socket.getfqdn)

    async def stop(self) -> None:
        """Close the server and release every session."""
        self.release_all("stopped")
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def hold(self, session: HeldSession) -> None:
        """Keep ``session`` until it is pulled, released, or times out."""
        self._sessions.hold(session.session_id, session, self._released)

    def release(self, session_id: str, status: str) -> bool:
        """Drop a session and free its blocks; False when it is not held."""
        return self._sessions.release(session_id, status)

    def release_all(self, status: str) -> int:
        """Release every held session; how many there were."""
        return self._sessions.release_all(status)

    def _released(self, session: HeldSession, status: str) -> None:
        """Free a released session's blocks and publish its transfer event."""
        session.release()
        self._publish(
            runtime_event(
                pb.RUNTIME_EVENT_TYPE_TRANSFER,
                session_id=session.session_id,
                direction="send",
                status=status,
                tokens=len(session.token_ids),
            )
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            asked = json.loads(await reader.readline())
            session = self._sessions.get(str(asked.get("session_id", "")))
            if session is None:
                reply: dict[str, object] = {"ok": False, "error": "not_found"}
            else:
                reply = {"ok": True, "token_ids": list(session.token_ids), "lora_name": session.lora_name}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
            if session is not None:
                self.release(session.session_id, "pulled")
        except (OSError, ValueError, AttributeError, asyncio.IncompleteReadError):
            pass  # a broken or malformed pull: the session stays held until pulled again or timed out
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def session_ref(session_id: str, endpoint: Endpoint, dp_rank: int, tokens: int) -> KvSession:
    """The ``KvSession`` a prefill hands to its client."""
    return KvSession(
        session_id=session_id,
        transfer_backend=TRANSFER_BACKEND,
        endpoints=(endpoint,),
        dp_rank=dp_rank,
        attributes={"prefilled_tokens": tokens},
    )


def tcp_endpoint(session: KvSession) -> Endpoint | None:
    """The endpoint a decode engine pulls ``session`` from, if it names one it can use."""
    return next((e for e in session.endpoints if e.protocol == PROTOCOL and e.host and e.port), None)


async def pull(session: KvSession, timeout_s: float) -> Transferred:
    """Fetch a prefilled session from its prefill engine; raises ``EngineFailure``."""
    endpoint = tcp_endpoint(session)
    assert endpoint is not None, "generate() accepts only sessions with a tcp endpoint"
    where = f"{endpoint.host}:{endpoint.port}"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, limit=_LINE_LIMIT)
            try:
                writer.write(json.dumps({"session_id": session.session_id}).encode() + b"\n")
                await writer.drain()
                reply = json.loads(await reader.readline())
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError) as exc:
        raise EngineFailure(
            pb.ERROR_CODE_KV_TRANSFER_FAILED,
            f"pulling KV session {session.session_id!r} from {where} failed: {exc or type(exc).__name__}",
            retryable=True,
            retry_after_ms=100,
        ) from None
    if not isinstance(reply, dict) or not isinstance(reply.get("token_ids", []), list):
        raise EngineFailure(
            pb.ERROR_CODE_KV_TRANSFER_FAILED,
            f"malformed KV transfer reply from {where}",
            retryable=True,
            retry_after_ms=100,
        )
    if not reply.get("ok"):
        raise EngineFailure(
            pb.ERROR_CODE_KV_SESSION_NOT_FOUND,
            f"the prefill engine at {where} holds no KV session {session.session_id!r} (expired, aborted or pulled)",
        )
    return Transferred(tuple(int(t) for t in reply["token_ids"]), session.session_id, str(reply["lora_name"]))


__all__ = ["PROTOCOL", "TRANSFER_BACKEND", "HeldSession", "SessionStore", "pull", "session_ref", "tcp_endpoint"]
