"""Score: every group and candidate exactly once, in order, with the actual scoring reported."""

from __future__ import annotations

import math
from typing import Any

import grpc
from google.protobuf.descriptor import EnumDescriptor

from ... import pb
from ...client import StatusError
from ...errors import enum_name
from ..kit import CheckFailed, Target, rule
from ..observe import advertised, check_dense, rows
from .tasks import context, item, require_task, unadvertised

SECTION = "Scoring"
_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_LABELS = [2, 1]
"""Label token ids, deliberately not sorted: the response must repeat their order."""


def _groups(target: Target, caps: pb.ScoreCapabilities) -> list[pb.ScoreGroup]:
    """Two groups of two candidates (fewer where the model's limits say so)."""
    groups = min(2, caps.max_groups) if caps.HasField("max_groups") else 2
    candidates = min(2, caps.max_candidates_per_group) if caps.HasField("max_candidates_per_group") else 2
    return [
        pb.ScoreGroup(
            group_id=f"g{g}",
            query=item(target, caps, "query", f"query {g}"),
            candidates=[item(target, caps, f"c{c}", f"candidate {g} {c}") for c in range(candidates)],
        )
        for g in range(groups)
    ]


def _request(target: Target, caps: pb.ScoreCapabilities, **options: Any) -> pb.ScoreRequest:
    return pb.ScoreRequest(context=context(target), groups=_groups(target, caps), options=pb.ScoreOptions(**options))


async def _score(target: Target, caps: pb.ScoreCapabilities, **options: Any) -> pb.ScoreResponse:
    """A checked response: every group and candidate once, in order, with well-formed scores."""
    request = _request(target, caps, **options)
    response = await target.client.score(request)
    if [g.group_id for g in response.groups] != [g.group_id for g in request.groups]:
        raise CheckFailed(f"groups {[g.group_id for g in response.groups]} differ from the request's, in order")
    for g, (sent, group) in enumerate(zip(request.groups, response.groups, strict=True)):
        if not group.HasField("group_index") or group.group_index != g:
            raise CheckFailed(f"groups[{g}].group_index is {_shown(group, 'group_index')}, expected {g}")
        wanted = [c.item_id for c in sent.candidates]
        if [c.candidate_id for c in group.candidates] != wanted:
            raise CheckFailed(f"groups[{g}] candidates {[c.candidate_id for c in group.candidates]}, expected {wanted}")
        for c, candidate in enumerate(group.candidates):
            where = f"groups[{g}].candidates[{c}]"
            if not candidate.HasField("candidate_index") or candidate.candidate_index != c:
                raise CheckFailed(f"{where}.candidate_index is {_shown(candidate, 'candidate_index')}, expected {c}")
            shape = check_dense(candidate.scores, where)
            limit = caps.max_output_values_per_candidate if caps.HasField("max_output_values_per_candidate") else None
            if limit is not None and len(candidate.scores.values) > limit:
                raise CheckFailed(
                    f"{where}: {len(candidate.scores.values)} values exceed max_output_values_per_candidate {limit}"
                )
            token_rows = response.granularity == pb.TASK_OUTPUT_GRANULARITY_TOKEN and candidate.token_ids
            if token_rows and len(candidate.token_ids) != shape[0]:
                raise CheckFailed(f"{where}: {len(candidate.token_ids)} token_ids for {shape[0]} token rows")
    for field in ("granularity", "semantics", "normalization"):
        if getattr(response, field) == 0:
            raise CheckFailed(f"ScoreResponse.{field} is UNSPECIFIED; the response reports the actual {field}")
    return response


def _shown(message: Any, field: str) -> object:
    return getattr(message, field) if message.HasField(field) else "absent"


@rule(
    "score.every-group-and-candidate",
    SECTION,
    "Group and candidate results preserve request order and carry their present zero-based original indexes, "
    "including index zero. A successful response contains every group and candidate exactly once. The engine "
    "never sorts candidates or echoes source documents.",
)
async def every_group_and_candidate(target: Target) -> None:
    caps = require_task(target, "score")
    await _score(target, caps)


@rule(
    "score.native-direction",
    "Task capability discovery",
    "A rankable native score advertises its default direction through higher_is_better; the response still "
    "reports the actual direction for each request.",
)
async def native_direction(target: Target) -> None:
    caps = require_task(target, "score")
    target.require(caps.HasField("higher_is_better"), "a native score direction (higher_is_better)")
    response = await _score(target, caps)
    if not response.HasField("higher_is_better"):
        raise CheckFailed("the response to native scoring does not report higher_is_better")


@rule(
    "score.label-tokens",
    SECTION,
    "When label_token_ids is non-empty, the engine performs causal-model label-token scoring and the response "
    "repeats those IDs in the same order. SOFTMAX requests normalization across each returned label vector.",
)
async def label_tokens(target: Target) -> None:
    caps = require_task(target, "score")
    target.require(advertised(caps, "supports_label_token_scoring"), "label-token scoring")
    labels = _LABELS[: caps.max_label_token_ids] if caps.HasField("max_label_token_ids") else _LABELS
    normalizations = [pb.SCORE_NORMALIZATION_UNSPECIFIED, *caps.normalizations]
    for normalization in normalizations:
        response = await _score(target, caps, label_token_ids=labels, normalization=normalization)
        if list(response.label_token_ids) != labels:
            raise CheckFailed(f"label_token_ids {labels} came back as {list(response.label_token_ids)}")
        if normalization:
            _reported("normalization", pb.ScoreNormalization.DESCRIPTOR, normalization, response.normalization)
        for group in response.groups:
            for candidate in group.candidates:
                if candidate.scores.shape[-1] != len(labels):
                    raise CheckFailed(f"a candidate's scores {list(candidate.scores.shape)} do not hold one per label")
                if response.normalization == pb.SCORE_NORMALIZATION_SOFTMAX:
                    for vector in rows(candidate.scores.values, candidate.scores.shape):
                        if not math.isclose(sum(vector), 1.0, rel_tol=1e-3):
                            raise CheckFailed(f"a SOFTMAX label vector sums to {sum(vector)}")


@rule("score.duplicate-labels", SECTION, "Duplicate label token IDs are invalid.")
async def duplicate_labels(target: Target) -> None:
    caps = require_task(target, "score")
    request = _request(target, caps, label_token_ids=[1, 1])
    await target.expect_status(target.client.score(request), _INVALID, what="duplicate label_token_ids")


@rule(
    "score.instruction",
    SECTION,
    "A non-empty instruction is valid only when instruction support is advertised; template selection and "
    "rendering remain engine-owned.",
)
async def instruction(target: Target) -> None:
    caps = require_task(target, "score")
    if advertised(caps, "supports_instruction"):
        await _score(target, caps, instruction="Judge relevance.")
        return
    request = _request(target, caps, instruction="Judge relevance.")
    await target.expect_status(target.client.score(request), _INVALID, what="an instruction without support")


@rule(
    "score.malformed-groups",
    SECTION,
    "Every score request has at least one group. Group IDs are unique, every group has one query and at least "
    "one candidate, and candidate IDs are unique within the group.",
)
async def malformed_groups(target: Target) -> None:
    caps = require_task(target, "score")
    cases: dict[str, list[pb.ScoreGroup]] = {}
    one = _groups(target, caps)[0]
    cases["a group without candidates"] = [pb.ScoreGroup(group_id="g", query=one.query)]
    cases["a group without a query"] = [pb.ScoreGroup(group_id="g", candidates=one.candidates)]
    if not caps.HasField("max_groups") or caps.max_groups > 1:
        cases["duplicate group ids"] = [one, one]
    twin = item(target, caps, "twin", "x")
    cases["duplicate candidate ids"] = [pb.ScoreGroup(group_id="g", query=one.query, candidates=[twin, twin])]
    for what, groups in cases.items():
        request = pb.ScoreRequest(context=context(target), groups=groups)
        await target.expect_status(target.client.score(request), _INVALID, what=what)


@rule(
    "score.explicit-options",
    SECTION,
    "Absent granularity and output semantics select model defaults. An explicit value must be supported. "
    "ScoreResponse reports the actual granularity, semantics, normalization, and label-token order.",
)
async def explicit_options(target: Target) -> None:
    caps = require_task(target, "score")
    for granularity in caps.granularities:
        response = await _score(target, caps, granularity=granularity)
        _reported("granularity", pb.TaskOutputGranularity.DESCRIPTOR, granularity, response.granularity)
    for semantics in caps.semantics:
        try:  # an advertised value may still not fit the scoring this request performs
            response = await _score(target, caps, output_semantics=semantics)
        except StatusError as error:
            if error.code != _INVALID:
                raise
            continue
        _reported("output_semantics", pb.TaskValueSemantics.DESCRIPTOR, semantics, response.semantics)
    probes = {
        "granularity": unadvertised(pb.TaskOutputGranularity.values(), caps.granularities),
        "output_semantics": unadvertised(pb.TaskValueSemantics.values(), caps.semantics),
        "normalization": unadvertised(pb.ScoreNormalization.values(), caps.normalizations),
    }
    for option, values in probes.items():
        if values:
            request = _request(target, caps, **{option: values[0]})
            await target.expect_status(target.client.score(request), _INVALID, what=f"an unadvertised {option}")


def _reported(option: str, enum: EnumDescriptor, requested: int, reported: int) -> None:
    """A response reports the enum option the request asked for."""
    if reported != requested:
        asked, got = enum_name(enum, requested), enum_name(enum, reported)
        raise CheckFailed(f"requested {option} {asked}, response reports {got}")


__all__: list[str] = []
