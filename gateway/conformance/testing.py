"""Running the conformance checks in process, from pytest."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from .. import compat
from ..client import Layout, OpenEngineClient
from ..compat import distribution_of
from ..core.gateway import GatewayOptions
from ..plugins import served
from ..spi.backend import Backend
from ..testing import serve_backends
from .kit import Outcome, Result, Target


@contextlib.asynccontextmanager
async def in_process_target(
    backend: Backend[Any],
    *,
    model: str = "model",
    options: GatewayOptions = GatewayOptions(),
    timeout_s: float = 60.0,
    layout: Layout = "seed",
) -> AsyncIterator[Target]:
    """Serve ``backend`` as ``model`` on a free loopback port and open a ``Target`` on it, speaking ``layout``.

    The driver's SPI revision is checked as the ``openengine-gateway`` command checks it: one it
    refuses raises its ``PluginError``, and one of an older revision is served through the same
    compatibility layer (the instance takes the adapter as its class).
    """
    driver = type(backend)
    backend.__class__ = served(driver, compat.assess(driver, backend.name or driver.__name__, *distribution_of(driver)))
    async with (
        serve_backends([(model, backend)], options=options) as running,
        target_at(running.address, model, timeout_s=timeout_s, layout=layout) as target,
    ):
        yield target


@contextlib.asynccontextmanager
async def target_at(
    address: str, model: str = "", *, timeout_s: float = 60.0, layout: Layout = "seed"
) -> AsyncIterator[Target]:
    """A ``Target`` for ``model`` (default: the first served) of the gateway serving at ``address``, on a
    client of its own speaking ``layout``, closed on exit."""
    client = await OpenEngineClient.connect(address, layout=layout)
    async with client:
        yield await Target.open(client, model, timeout_s=timeout_s)


def assert_conforms(result: Result) -> None:
    """Fail the test on a failed rule; skip it when the rule does not apply."""
    import pytest  # only where pytest runs: the kit itself does not depend on it

    if result.outcome is Outcome.NOT_APPLICABLE:
        pytest.skip(result.message)
    if result.outcome is Outcome.FAILED:
        pytest.fail(f"{result.rule.id}: {result.message}\n  rule: {result.rule.text}", pytrace=False)


__all__ = ["assert_conforms", "in_process_target", "target_at"]
