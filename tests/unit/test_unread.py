"""A slow reader's unread tokens are bounded per stream and per caller; a stream past a bound ends."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.core.unread import UnreadLedger
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import Candidate, EventStream, TokenDelta, TokenRecord, UsageReport


def _delta(tokens: int, candidates: int = 0) -> TokenDelta:
    record = [TokenRecord(1, "a", candidates=[Candidate(2, -1.0)] * candidates) for _ in range(tokens)]
    return TokenDelta(0, record, "a" * tokens)


async def test_a_stream_past_its_bound_drops_what_it_held_and_ends_overloaded() -> None:
    overflows: list[str] = []
    ledger = UnreadLedger(per_stream=100, per_caller=1000)
    stream = EventStream()
    stream.meter = meter = ledger.meter("alice", lambda: overflows.append("abort"))
    stream.put(_delta(10, candidates=4))  # 50 entries
    stream.put(UsageReport(1, 10))
    assert meter.held == 50 and ledger.by_caller["alice"] == 50
    first = await anext(aiter(stream))
    assert isinstance(first, TokenDelta) and meter.held == 0  # read: no longer held
    stream.put(_delta(10, candidates=4))
    stream.put(_delta(11, candidates=4))  # 105 unread: past the stream's bound
    assert overflows == ["abort"] and stream.closed
    assert isinstance(await anext(aiter(stream)), UsageReport)  # the latest usage outlives it
    with pytest.raises(EngineFailure) as ended:
        await anext(aiter(stream))
    assert ended.value.code == pb.ERROR_CODE_OVERLOADED and "--max-unread-per-stream" in ended.value.message
    meter.close()
    assert not ledger.by_caller


def test_one_callers_streams_share_its_bound_and_another_caller_is_untouched() -> None:
    ledger = UnreadLedger(per_stream=100, per_caller=150)
    streams = [EventStream() for _ in range(3)]
    meters = [ledger.meter(name, lambda: None) for name in ("alice", "alice", "bob")]
    for stream, meter in zip(streams, meters, strict=True):
        stream.meter = meter
        stream.put(_delta(80))
    assert [stream.closed for stream in streams] == [False, True, False]  # alice's second: 160 > 150
    meters[1].close()
    assert ledger.by_caller == {"alice": 80, "bob": 80}
