"""The ``remote`` backend: a model of another OpenEngine server, served as a local engine.

A front gateway with ``remote`` engines fans out to engines in other processes or on other
machines, this project's gateways or any other OpenEngine v1 server. The front advertises
exactly what the remote advertises, relays streams, errors, health, load and events, and
propagates aborts and cancellations.
"""

from .backend import RemoteBackend
from .settings import RemoteSettings

__all__ = ["RemoteBackend", "RemoteSettings"]
