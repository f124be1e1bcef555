"""``RemoteSettings``: where the remote OpenEngine server is and how to reach it."""

from __future__ import annotations

import os
from typing import Literal

from openengine_gateway.spi import BackendSettings
from pydantic import Field, model_validator

EventRelay = Literal["auto", "on", "off"]
RemoteLayout = Literal["auto", "seed", "later"]


class RemoteSettings(BackendSettings):
    """Options of the ``remote`` backend (``plugins.toml`` or ``--option value`` flags).

    ``model`` is the model's name on the remote server; empty picks the remote's only model.
    """

    target: str = Field(min_length=1)
    """``host:port`` of the remote OpenEngine server (any gRPC target string)."""
    layout: RemoteLayout = "auto"
    """The services the remote serves: the seed's ``openengine.v1.OpenEngine``, upstream's later
    ``Inference``/``Control`` (TensorRT-LLM's own server), or ``auto``: the seed's unless it answers
    UNIMPLEMENTED, then the later."""

    # -- security ---------------------------------------------------------------------------
    token: str | None = None
    """Bearer token sent with every call; prefer ``token_env`` outside tests."""
    token_env: str | None = None
    """Name of the environment variable that holds the bearer token."""
    tls: bool = False
    """TLS with the system's roots (implied by ``ca_file`` or ``cert_file``)."""
    ca_file: str | None = None
    """PEM roots to verify the remote with."""
    cert_file: str | None = None
    """PEM client certificate chain, for mutual TLS (with ``key_file``)."""
    key_file: str | None = None
    check_compatibility: bool = True
    """Refuse a remote whose schema revision or release the client was not tested with."""

    # -- time -------------------------------------------------------------------------------
    connect_timeout_s: float = Field(default=30.0, gt=0)
    """How long ``start`` keeps trying to reach the remote before the gateway gives up."""
    call_timeout_s: float = Field(default=30.0, gt=0)
    """Deadline of metadata and lifecycle calls (load, LoRA, abort)."""
    health_timeout_s: float = Field(default=5.0, gt=0)
    """Deadline of the relayed health check; past it the engine is NOT_READY."""
    resubscribe_delay_s: float = Field(default=0.5, gt=0)
    """First wait before an event subscription is reopened; it doubles up to 16 times that."""

    # -- relayed event streams ---------------------------------------------------------------
    kv_events: EventRelay = "auto"
    runtime_events: EventRelay = "auto"
    """``auto`` asks the remote at start (UNIMPLEMENTED means it does not publish)."""
    event_probe_s: float = Field(default=1.0, gt=0)
    """How long the ``auto`` question waits: a quiet, open subscription counts as publishing."""
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> RemoteSettings:
        if self.token is not None and self.token_env is not None:
            raise ValueError("set token or token_env, not both")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.layout == "later" and self.runtime_events == "on":
            raise ValueError("runtime_events = on needs the seed layout: the later one has no runtime events")
        return self

    def bearer_token(self) -> str | None:
        """The token to send, read from the environment when ``token_env`` names it."""
        if self.token_env is None:
            return self.token
        token = os.environ.get(self.token_env)
        if not token:
            raise ValueError(f"token_env names {self.token_env!r}, which is not set")
        return token


__all__ = ["EventRelay", "RemoteLayout", "RemoteSettings"]
