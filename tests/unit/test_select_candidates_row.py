"""``select_candidates`` with the whole vocabulary's row as an array: vocabulary ranks, the lower id first on ties."""

from __future__ import annotations

import numpy as np
import pytest
from openengine_gateway import pb
from openengine_gateway.errors import EngineFailure
from openengine_gateway.spi import Candidate, CandidateSelection, select_candidates

ROW = np.array([-2.0, -0.5, -1.0, -0.5, -3.0], dtype=np.float32)
TOP_N, TOKEN_IDS, ALL = (
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
)


def test_top_n_in_rank_order_with_ties_to_the_lower_id() -> None:
    candidates = select_candidates(CandidateSelection(TOP_N, top_n=3), ROW, decode=lambda i: f"<{i}>")
    assert candidates == [Candidate(1, -0.5, "<1>", 1), Candidate(3, -0.5, "<3>", 2), Candidate(2, -1.0, "<2>", 3)]
    assert all(type(c.token_id) is int and type(c.logprob) is float for c in candidates)


def test_a_tie_at_the_cut_keeps_the_lower_id() -> None:
    assert [c.token_id for c in select_candidates(CandidateSelection(TOP_N, top_n=1), ROW)] == [1]
    assert select_candidates(CandidateSelection(TOP_N, top_n=0), ROW) == []
    assert len(select_candidates(CandidateSelection(TOP_N, top_n=9), ROW)) == 5


def test_explicit_ids_in_request_order_with_their_vocabulary_ranks() -> None:
    candidates = select_candidates(CandidateSelection(TOKEN_IDS, token_ids=(4, 3, 0)), ROW)
    assert [(c.token_id, c.rank) for c in candidates] == [(4, 5), (3, 2), (0, 4)]


def test_all_in_rank_order_and_a_list_works_too() -> None:
    assert [c.token_id for c in select_candidates(CandidateSelection(ALL), ROW)] == [1, 3, 2, 0, 4]
    assert [c.rank for c in select_candidates(CandidateSelection(ALL), ROW.tolist())] == [1, 2, 3, 4, 5]


def test_an_id_past_the_row_is_a_failure_not_a_made_up_value() -> None:
    with pytest.raises(EngineFailure, match=r"no logprob for candidate ids \[7\]") as raised:
        select_candidates(CandidateSelection(TOKEN_IDS, token_ids=(1, 7)), ROW)
    assert raised.value.code == pb.ERROR_CODE_INTERNAL


def test_the_row_agrees_with_the_mapping_form() -> None:
    rng = np.random.default_rng(0)
    row = np.log(rng.dirichlet(np.ones(64)))
    as_mapping = dict(enumerate(row.tolist()))
    for selection in (CandidateSelection(TOP_N, top_n=5), CandidateSelection(ALL)):
        assert select_candidates(selection, row) == select_candidates(selection, as_mapping)
