"""Mock configurations the contract suite runs the conformance kit against, over real gRPC.

Each configuration is one mock engine behind one in-process gateway. Gateways start lazily
the first time a test needs them and live for the whole session, so the hundreds of rule
checks share a handful of servers; a disruptive rule (a Drain that stops admission) gets a
fresh server of its own. A small step time keeps long requests in flight while a check
aborts, cancels or drains them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_gateway.client import Layout, OpenEngineClient
from openengine_gateway.conformance import Outcome, Target, in_process_target
from openengine_gateway.core.gateway import GatewayOptions
from openengine_gateway.testing import RunningGateway, serve_backends

STEP_S = 0.005
"""Simulated decode step: a 1024-token request runs for over five seconds unless stopped."""

OFF: dict[str, Any] = {
    "enable_text_input": False,
    "enable_output_logprobs": False,
    "enable_prompt_logprobs": False,
    "guided_decoding_modes": (),
    "enable_priority": False,
    "enable_stop_in_output": False,
    "enable_cache_salt": False,
    "enable_prefix_cache_bypass": False,
    "enable_lora": False,
    "enable_embed": False,
    "enable_classify": False,
    "enable_score": False,
    "enable_kv_events": False,
    "enable_runtime_events": False,
}
"""Every capability switch of the mock turned off (token-id prompts are its only input)."""

CONFIGS: dict[str, dict[str, Any]] = {
    "all-on": {},
    "all-off": OFF,
    "prefill": {"role": "prefill"},
    "decode": {"role": "decode"},
    "dp2-multimodal": {"data_parallel_size": 2, "enable_multimodal": True},
}
"""Mock settings per configuration (on top of the step time)."""


def mock(**settings: Any) -> MockBackend:
    """A mock engine whose decode steps take ``STEP_S`` unless ``settings`` say otherwise."""
    return MockBackend(MockSettings(**{"decode_time_per_step_s": STEP_S, **settings}))


@contextlib.asynccontextmanager
async def fresh_target(
    config: str, options: GatewayOptions = GatewayOptions(), *, layout: Layout = "seed"
) -> AsyncIterator[Target]:
    """A new gateway for ``config``, asked in ``layout``, closed on exit."""
    async with in_process_target(mock(**CONFIGS[config]), options=options, timeout_s=30.0, layout=layout) as target:
        yield target


class Targets:
    """Session-wide gateways, one per configuration and layout, started on first use; and the outcome of
    each rule run on them, for comparing the layouts."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack
        self._targets: dict[tuple[str, Layout], Target] = {}
        self.outcomes: dict[tuple[str, Layout, str], Outcome] = {}
        """(configuration, layout, rule id) -> the rule's outcome there."""

    async def get(self, config: str, layout: Layout = "seed") -> Target:
        """The shared target for ``config`` in ``layout``."""
        if (config, layout) not in self._targets:
            target = await self._stack.enter_async_context(fresh_target(config, layout=layout))
            self._targets[config, layout] = target
        return self._targets[config, layout]


@pytest.fixture(scope="session")
async def targets() -> AsyncIterator[Targets]:
    """Shared gateways for every configuration, stopped at the end of the session."""
    async with contextlib.AsyncExitStack() as stack:
        yield Targets(stack)


@dataclass
class Served:
    """A mock engine behind its own gateway, with the handles a mock-specific test needs."""

    backend: MockBackend
    running: RunningGateway
    target: Target

    @property
    def client(self) -> OpenEngineClient:
        """A connected OpenEngine client."""
        return self.target.client


@contextlib.asynccontextmanager
async def serve(options: GatewayOptions = GatewayOptions(), **settings: Any) -> AsyncIterator[Served]:
    """Serve one mock engine (``settings`` over the step time) as ``model``; stopped on exit."""
    backend = mock(**settings)
    async with serve_backends([("model", backend)], options=options) as running:
        client = await OpenEngineClient.connect(running.address)
        async with client:
            yield Served(backend, running, await Target.open(client, "model", timeout_s=30.0))
