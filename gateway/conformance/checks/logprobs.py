"""Prompt and output logprobs: one aligned TokenInfo per token, candidates as selected."""

from __future__ import annotations

import math

import grpc

from ... import pb
from ..kit import CheckFailed, Target, rule
from ..observe import Stream, advertised, present

SECTION = "Generation API"
MODELS = "Model and capacity metadata"


def _caps(target: Target, side: str) -> pb.LogprobCapabilities:
    """The side's capabilities (``NotApplicable`` unless supported)."""
    target.require_generation()
    generation = target.model_info.generation
    caps: pb.LogprobCapabilities = getattr(generation, f"{side}_logprobs")
    target.require(
        present(generation, f"{side}_logprobs") and advertised(caps, "supported"),
        f"{side} logprobs",
    )
    return caps


def _top_n(caps: pb.LogprobCapabilities, wanted: int = 3) -> int:
    return min(wanted, caps.max_top_n) if caps.HasField("max_top_n") else wanted


def _request_candidates(
    target: Target, side: str, selection: pb.CandidateTokenSelection, **options: object
) -> pb.GenerateRequest:
    request = target.prompt(temperature=0.0, ignore_eos=True, **options)
    setattr(request.response, f"return_{side}_logprobs", True)
    getattr(request.response, f"{side}_candidates").CopyFrom(selection)
    return request


def _aligned(info: pb.TokenInfo, where: str) -> None:
    """A token among its own candidates carries the same logprob there."""
    for candidate in info.candidates:
        if candidate.token_id == info.token_id and not math.isclose(
            candidate.logprob, info.logprob, rel_tol=1e-4, abs_tol=1e-4
        ):
            raise CheckFailed(
                f"{where}: token {info.token_id} has logprob {info.logprob} but {candidate.logprob} among its "
                "candidates (misaligned records)"
            )


def _prompt(stream: Stream) -> pb.PromptOutput:
    """The stream's one PromptOutput."""
    prompts = stream.events("prompt")
    if len(prompts) != 1:
        raise CheckFailed(f"{len(prompts)} PromptOutput events for a request with prompt logprobs")
    return prompts[0].prompt


def _unique_ids(info: pb.TokenInfo, where: str) -> list[int]:
    ids = [c.token_id for c in info.candidates]
    if len(set(ids)) != len(ids):
        raise CheckFailed(f"{where}: candidate token ids repeat: {ids}")
    return ids


@rule(
    "logprobs.output-token-info",
    SECTION,
    "Each prompt or output token is represented by one TokenInfo, so its ID, text, score, rank, and candidates "
    "cannot become positionally misaligned.",
)
async def output_token_info(target: Target) -> None:
    _caps(target, "output")
    stream = (await target.run(target.prompt(max_tokens=4, ignore_eos=True, return_output_logprobs=True))).succeeded()
    tokens = stream.tokens()
    if len(tokens) != 4:
        raise CheckFailed(f"4 generated tokens arrived as {len(tokens)} TokenInfo records")
    for position, info in enumerate(tokens):
        if not info.HasField("logprob"):
            raise CheckFailed(f"output token {position} has no logprob although output logprobs were requested")


@rule(
    "logprobs.output-top-n",
    SECTION,
    "CandidateTokenSelection requests either the top N candidates, explicit token IDs, or the full vocabulary at "
    "each prompt or output position.",
)
async def output_top_n(target: Target) -> None:
    caps = _caps(target, "output")
    target.require(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N in caps.candidate_selection_modes, "top-N candidates")
    n = _top_n(caps)
    stream = await _run(target, "output", pb.CandidateTokenSelection(top_n=n))
    for position, info in enumerate(stream.tokens()):
        where = f"output token {position}"
        ids = _unique_ids(info, where)
        if len(ids) != n:
            raise CheckFailed(f"{where}: top_n={n} returned {len(ids)} candidates")
        best = max(info.candidates, key=lambda c: c.logprob)
        if info.token_id not in ids or best.logprob > info.logprob + 1e-4:
            raise CheckFailed(f"{where}: the greedy token {info.token_id} is not the best of the top-{n} candidates")
        _aligned(info, where)


@rule(
    "logprobs.output-token-ids",
    SECTION,
    "CandidateTokenSelection requests either the top N candidates, explicit token IDs, or the full vocabulary at "
    "each prompt or output position.",
)
async def output_token_ids(target: Target) -> None:
    caps = _caps(target, "output")
    target.require(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS in caps.candidate_selection_modes, "token-id candidates")
    wanted = sorted(set((await target.greedy()).token_ids()[:2]))
    stream = await _run(target, "output", pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=wanted)))
    for position, info in enumerate(stream.tokens()):
        where = f"output token {position}"
        if sorted(_unique_ids(info, where)) != wanted:
            raise CheckFailed(f"{where}: candidates {[c.token_id for c in info.candidates]}, requested ids {wanted}")
        _aligned(info, where)


@rule(
    "logprobs.output-all",
    SECTION,
    "CandidateTokenSelection requests either the top N candidates, explicit token IDs, or the full vocabulary at "
    "each prompt or output position. Select all candidates with all {}.",
)
async def output_all(target: Target) -> None:
    caps = _caps(target, "output")
    target.require(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL in caps.candidate_selection_modes, "all-vocabulary candidates")
    stream = await _run(target, "output", pb.CandidateTokenSelection(all=pb.AllCandidates()), max_tokens=2)
    sizes = set()
    for position, info in enumerate(stream.tokens()):
        where = f"output token {position}"
        ids = _unique_ids(info, where)
        sizes.add(len(ids))
        if info.token_id not in ids:
            raise CheckFailed(f"{where}: the full vocabulary does not include the sampled token {info.token_id}")
        _aligned(info, where)
    if len(sizes) != 1 or min(sizes) < 2:
        raise CheckFailed(f"all-vocabulary candidate counts per position are {sorted(sizes)}")


async def _run(target: Target, side: str, selection: pb.CandidateTokenSelection, max_tokens: int = 3) -> Stream:
    request = _request_candidates(target, side, selection, max_tokens=max_tokens)
    return (await target.run(request)).succeeded()


@rule(
    "logprobs.prompt-output",
    SECTION,
    "PromptOutput is emitted at most once when prompt token information is requested. The first prompt token has "
    "no conditional probability and therefore omits logprob and rank and has no candidates.",
)
async def prompt_output(target: Target) -> None:
    _caps(target, "prompt")
    request = target.prompt(max_tokens=2, return_prompt_logprobs=True)
    stream = (await target.run(request)).succeeded()
    tokens = list(_prompt(stream).tokens)
    if not tokens:
        raise CheckFailed("the PromptOutput has no tokens")
    first = tokens[0]
    if first.HasField("logprob") or first.HasField("rank") or first.candidates:
        raise CheckFailed("the first prompt token carries a logprob, rank or candidates")
    for position, info in enumerate(tokens[1:], start=1):
        if not info.HasField("logprob"):
            raise CheckFailed(f"prompt token {position} has no logprob")


@rule(
    "logprobs.prompt-one-per-token",
    SECTION,
    "Each prompt or output token is represented by one TokenInfo.",
)
async def prompt_one_per_token(target: Target) -> None:
    _caps(target, "prompt")
    request = target.token_prompt(max_tokens=1, return_prompt_logprobs=True)
    stream = (await target.run(request)).succeeded()
    prompt = _prompt(stream)
    ids, sent = [t.token_id for t in prompt.tokens], list(request.token_ids.ids)
    if ids != sent:
        raise CheckFailed(f"prompt token records {ids} do not match the prompt's token ids {sent}")
    if stream.usage.prompt_tokens != len(ids):
        raise CheckFailed(f"{len(ids)} prompt token records but usage.prompt_tokens {stream.usage.prompt_tokens}")


@rule(
    "logprobs.prompt-top-n",
    SECTION,
    "Candidate entries for other tokens follow the corresponding prompt or output candidate selection.",
)
async def prompt_top_n(target: Target) -> None:
    caps = _caps(target, "prompt")
    target.require(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N in caps.candidate_selection_modes, "top-N prompt candidates")
    n = _top_n(caps)
    stream = await _run(target, "prompt", pb.CandidateTokenSelection(top_n=n), max_tokens=1)
    prompt = _prompt(stream)
    for position, info in enumerate(prompt.tokens[1:], start=1):
        where = f"prompt token {position}"
        if len(_unique_ids(info, where)) != n:
            raise CheckFailed(f"{where}: top_n={n} returned {len(info.candidates)} candidates")
        _aligned(info, where)


@rule(
    "logprobs.unadvertised-rejected",
    MODELS,
    "Capability submessages distinguish unreported support (message absent) from reported support or lack of "
    "support; candidate selection modes and max_top_n are reported independently for prompt and output logprobs "
    "and advertise the limits of the request options.",
)
async def unadvertised_rejected(target: Target) -> None:
    target.require_generation()
    generation, tried = target.model_info.generation, 0
    for side in ("prompt", "output"):
        caps: pb.LogprobCapabilities = getattr(generation, f"{side}_logprobs")
        supported = advertised(caps, "supported")
        if caps.HasField("supported") and not supported:
            request = target.prompt(max_tokens=1)
            setattr(request.response, f"return_{side}_logprobs", True)
            await target.expect_rejected(request, grpc.StatusCode.INVALID_ARGUMENT, what=f"unsupported {side} logprobs")
            tried += 1
        if not supported:
            continue
        selections = {
            pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N: pb.CandidateTokenSelection(top_n=1),
            pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS: pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[1])),
            pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL: pb.CandidateTokenSelection(all=pb.AllCandidates()),
        }
        for mode, selection in selections.items():
            if mode not in caps.candidate_selection_modes:
                request = _request_candidates(target, side, selection, max_tokens=1)
                name = pb.CandidateTokenSelectionMode.Name(mode)
                await target.expect_rejected(
                    request, grpc.StatusCode.INVALID_ARGUMENT, what=f"unadvertised {side} {name} candidates"
                )
                tried += 1
        if caps.HasField("max_top_n") and pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N in caps.candidate_selection_modes:
            request = _request_candidates(target, side, pb.CandidateTokenSelection(top_n=caps.max_top_n + 1))
            await target.expect_rejected(
                request, grpc.StatusCode.INVALID_ARGUMENT, what=f"{side} top_n above max_top_n {caps.max_top_n}"
            )
            tried += 1
    target.require(tried > 0, "a logprob option it does not support")


__all__: list[str] = []
