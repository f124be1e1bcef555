"""Generation stream invariants."""

from __future__ import annotations

from ... import pb
from ..kit import CheckFailed, Target, rule

SECTION = "Generation API"


@rule(
    "generate.output-index-present",
    SECTION,
    "TokenOutput and GenerationFinished are output-scoped and must carry output_index, including index zero.",
)
async def output_index_present(target: Target) -> None:
    target.require_role(pb.ENGINE_ROLE_AGGREGATED)
    for message in await target.collect(target.prompt(max_tokens=4)):
        kind = message.WhichOneof("event")
        if kind in ("token", "finished") and not getattr(message, kind).HasField("output_index"):
            raise CheckFailed(f"a {kind} event has no output_index")


__all__: list[str] = []
