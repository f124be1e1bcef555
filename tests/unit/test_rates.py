"""A per-caller token bucket: a burst, then the rate, each caller on its own."""

from __future__ import annotations

import pytest
from openengine_gateway.core.callers import Caller
from openengine_gateway.core.rates import RateLimit
from openengine_gateway.errors import ResourceExhausted


def test_a_burst_then_the_rate_with_the_wait_as_the_hint() -> None:
    now = [0.0]
    limit = RateLimit("probes", "--max-probes-per-s", per_s=2.0, burst=3, clock=lambda: now[0])
    alice = Caller("alice", sees_all=False)
    for _ in range(3):
        limit.take(alice)
    with pytest.raises(ResourceExhausted) as refused:
        limit.take(alice)
    assert refused.value.retry_after_ms == 500 and "--max-probes-per-s" in refused.value.message
    now[0] = 0.5  # one token back
    limit.take(alice)
    with pytest.raises(ResourceExhausted):
        limit.take(alice)


def test_callers_without_a_token_share_a_bucket_per_host_not_per_connection() -> None:
    limit = RateLimit("probes", "--max-probes-per-s", per_s=1.0, burst=1, clock=lambda: 0.0)
    limit.take(Caller(peer="ipv4:10.0.0.7:5000"))
    with pytest.raises(ResourceExhausted):
        limit.take(Caller(peer="ipv4:10.0.0.7:5001"))  # another connection, the same host
    limit.take(Caller(peer="ipv4:10.0.0.8:5000"))
    limit.take(Caller("bob", sees_all=False, peer="ipv4:10.0.0.7:5002"))  # a token is its own caller
