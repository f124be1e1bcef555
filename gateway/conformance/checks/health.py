"""Health checks and inference probes; GetLoad snapshots and their presence semantics."""

from __future__ import annotations

from ... import pb
from ..kit import CheckFailed, Target, rule
from .abort import idle

SECTION = "Health, abort, and drain"
OBSERVABILITY = "Runtime observability"


def _checked(response: pb.HealthResponse) -> pb.HealthResponse:
    if response.state == pb.HEALTH_STATE_UNSPECIFIED:
        raise CheckFailed("HealthResponse.state is UNSPECIFIED")
    for check in response.checks:
        if not check.name or check.state == pb.HEALTH_STATE_UNSPECIFIED:
            raise CheckFailed(f"a health check lacks a name or state: {check}")
    return response


@rule(
    "health.state",
    SECTION,
    "False means a lightweight readiness/liveness check: HealthResponse reports a HealthState and named checks.",
)
async def state(target: Target) -> None:
    response = _checked(await target.client.health())
    if response.state != pb.HEALTH_STATE_READY:
        raise CheckFailed(f"an idle, serving engine reports {pb.HealthState.Name(response.state)}")


@rule(
    "health.inference-probe",
    SECTION,
    "True asks the engine to run a role-appropriate minimal inference probe and report it as a check. Empty "
    "model means engine default served model.",
)
async def inference_probe(target: Target) -> None:
    for request in (
        pb.HealthRequest(include_inference_probe=True),
        pb.HealthRequest(include_inference_probe=True, model=target.model, role=target.role),
    ):
        response = _checked(await target.client.health(request))
        probes = [c for c in response.checks if c.name == "inference_probe"]
        if len(probes) != 1:
            raise CheckFailed(f"{len(probes)} inference_probe checks in {[c.name for c in response.checks]}")
        if probes[0].state != pb.HEALTH_STATE_READY:
            raise CheckFailed(f"the inference probe of a healthy engine reports {probes[0]}")


@rule(
    "load.idle-is-zero",
    OBSERVABILITY,
    "Every load scalar has explicit presence. Absent means unavailable in that engine or snapshot; present zero "
    "means the measured load is zero.",
)
async def idle_is_zero(target: Target) -> None:
    await idle(target)
    load = await target.client.load(per_rank=True)
    for rank in load.ranks:
        for name in ("running_requests", "queued_requests"):
            if rank.HasField(name) and getattr(rank, name) != 0:
                raise CheckFailed(
                    f"an idle engine's rank {rank.data_parallel_rank} reports {name} {getattr(rank, name)}"
                )
    _blocks_fit(load)
    for rank_load in load.ranks:
        _blocks_fit(rank_load)


def _blocks_fit(scope: pb.LoadInfo | pb.RankLoadInfo) -> None:
    both = scope.HasField("used_kv_blocks") and scope.HasField("total_kv_blocks")
    if both and scope.used_kv_blocks > scope.total_kv_blocks:
        raise CheckFailed(f"used_kv_blocks {scope.used_kv_blocks} exceeds total_kv_blocks {scope.total_kv_blocks}")


@rule(
    "load.per-rank",
    OBSERVABILITY,
    "GetLoadRequest.include_per_rank asks for RankLoadInfo entries; without it the snapshot is engine-wide.",
)
async def per_rank(target: Target) -> None:
    without = await target.client.load()
    if without.ranks:
        raise CheckFailed(f"{len(without.ranks)} per-rank entries although include_per_rank was false")
    with_ranks = await target.client.load(per_rank=True)
    parallelism = target.engine_info.parallelism
    if with_ranks.ranks and parallelism.HasField("data_parallel_size"):
        ranks = [r.data_parallel_rank for r in with_ranks.ranks if r.HasField("data_parallel_rank")]
        if len(set(ranks)) != len(ranks):
            raise CheckFailed(f"per-rank entries repeat ranks: {ranks}")


__all__: list[str] = []
