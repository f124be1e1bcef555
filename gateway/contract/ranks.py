"""One data-parallel rank space per endpoint, however many engines serve behind it.

Ranks attribute KV event batches, per-rank load and KV event sources to the engine replica
that produced them, and ``kv.data_parallel_rank`` in a Generate request names one. Each
engine has ``width`` ranks (its ``data_parallel_size``, 1 when unreported) and numbers them
natively from its ``data_parallel_start_rank`` (0 when unreported).

* One engine: the endpoint's ranks are the engine's own; nothing is translated.
* Several engines: they take consecutive blocks of endpoint ranks in configuration order.
  Engine ``i``'s native rank ``n`` is endpoint rank ``base_i + (n - start_i)``, with
  ``base_0 = 0`` and ``base_{i+1} = base_i + width_i``. Per-rank KV sequence numbers then
  stay strictly increasing (two engines never share a rank), and a client tells engines apart
  by rank. A native rank outside an engine's advertised ranks cannot be attributed: it is a
  driver error, never a guess.

A request's rank is the engine's 0-based replica index after translation (``rank - base_i``),
the same meaning it has when the engine is served alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import pb
from ..errors import Internal, InvalidArgument


@dataclass(frozen=True, slots=True)
class RankSpan:
    """Where one engine's ranks sit in the endpoint's rank space."""

    base: int
    """The engine's first endpoint rank (shared spaces only)."""
    start: int
    """The engine's first native rank (its ``data_parallel_start_rank``)."""
    width: int
    """How many ranks the engine has (its ``data_parallel_size``)."""
    shared: bool = False
    """Several engines share the endpoint, so ranks are translated."""

    @classmethod
    def of(cls, parallelism: pb.ParallelismInfo, *, base: int = 0, shared: bool = False) -> RankSpan:
        """The span of an engine that reports ``parallelism``, placed at ``base``."""
        width = parallelism.data_parallel_size if parallelism.HasField("data_parallel_size") else 1
        start = parallelism.data_parallel_start_rank if parallelism.HasField("data_parallel_start_rank") else 0
        return cls(base, start, max(width, 1), shared)

    @property
    def ranks(self) -> range:
        """The engine's ranks as the endpoint numbers them."""
        first = self.base if self.shared else self.start
        return range(first, first + self.width)

    def to_endpoint(self, native: int) -> int:
        """The endpoint rank of the engine's native rank ``native``.

        Raises ``Internal`` in a shared space when the engine reports a rank it did not advertise.
        """
        if not self.shared:
            return native
        if not self.start <= native < self.start + self.width:
            raise Internal(
                f"the engine reported data-parallel rank {native}; it advertises ranks "
                f"{self.start}..{self.start + self.width - 1}"
            )
        return self.base + native - self.start

    def to_engine(self, rank: int) -> int:
        """A request's endpoint rank as the engine's replica index; ``InvalidArgument`` when not its own."""
        if not self.shared:
            return rank
        if rank not in self.ranks:
            raise InvalidArgument(
                f"kv.data_parallel_rank {rank} is not one of this model's ranks "
                f"({self.ranks.start}..{self.ranks.stop - 1})"
            )
        return rank - self.base


def shared_spans(parallelisms: list[pb.ParallelismInfo]) -> list[RankSpan]:
    """The spans of engines that share one endpoint, in configuration order."""
    if len(parallelisms) == 1:
        return [RankSpan.of(parallelisms[0])]
    spans: list[RankSpan] = []
    base = 0
    for parallelism in parallelisms:
        span = RankSpan.of(parallelism, base=base, shared=True)
        spans.append(span)
        base += span.width
    return spans


__all__ = ["RankSpan", "shared_spans"]
