"""``contract.ranks``: one data-parallel rank space for every engine behind an endpoint."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.ranks import RankSpan, shared_spans
from openengine_gateway.errors import Internal, InvalidArgument


def test_one_engine_keeps_its_own_ranks() -> None:
    (span,) = shared_spans([pb.ParallelismInfo(data_parallel_size=2, data_parallel_start_rank=4)])
    assert not span.shared and list(span.ranks) == [4, 5]
    assert span.to_endpoint(9) == 9 and span.to_engine(1) == 1  # identity: the engine validates itself


def test_unreported_parallelism_is_one_rank_from_zero() -> None:
    span = RankSpan.of(pb.ParallelismInfo())
    assert (span.start, span.width, list(span.ranks)) == (0, 1, [0])


def test_several_engines_take_consecutive_blocks_in_order() -> None:
    spans = shared_spans(
        [
            pb.ParallelismInfo(data_parallel_size=2),
            pb.ParallelismInfo(),
            pb.ParallelismInfo(data_parallel_size=3, data_parallel_start_rank=8),
        ]
    )
    assert [list(s.ranks) for s in spans] == [[0, 1], [2], [3, 4, 5]]
    assert [spans[2].to_endpoint(native) for native in (8, 9, 10)] == [3, 4, 5]
    assert [spans[2].to_engine(rank) for rank in (3, 4, 5)] == [0, 1, 2]  # the engine's replica index


@pytest.mark.parametrize("native", [7, 11, 0])
def test_an_unadvertised_native_rank_cannot_be_attributed(native: int) -> None:
    span = shared_spans([pb.ParallelismInfo(), pb.ParallelismInfo(data_parallel_size=3, data_parallel_start_rank=8)])[1]
    with pytest.raises(Internal, match=r"advertises ranks 8\.\.10"):
        span.to_endpoint(native)


@pytest.mark.parametrize("rank", [0, 4])
def test_a_request_rank_of_another_engine_is_invalid(rank: int) -> None:
    span = shared_spans([pb.ParallelismInfo(), pb.ParallelismInfo(data_parallel_size=3)])[1]
    with pytest.raises(InvalidArgument, match=r"not one of this model's ranks \(1..3\)"):
        span.to_engine(rank)
