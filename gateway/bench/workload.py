"""The benchmark workload: a seeded, deterministic sequence of requests every target replays.

Request ``i`` depends only on the seed and ``i``: the sequence is drawn from one seeded generator
and kept as it grows, so a run bounded by duration (where each target sends a different number of
requests) still sends every target the same prompt, output length and arrival time for each index,
and results can be compared request by request. Prompts are text, measured in characters (one
token per byte on the mock engine), or token ids when a vocabulary size is given; shared-prefix
groups put ``prefix_length`` identical units before every prompt of a group, for prefix caching.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from .arrivals import arrival_offsets
from .errors import WorkloadError
from .prompts import PromptEntry, synthetic_text

Prompt = str | tuple[int, ...]
"""Text, or token ids."""


@dataclass(frozen=True)
class Lengths:
    """A length distribution: fixed when ``low == high``, else uniform over ``[low, high]``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise WorkloadError(f"a length range needs 0 <= low <= high, not {self.low}:{self.high}")

    @classmethod
    def parse(cls, text: str) -> Lengths:
        """``"128"`` (fixed) or ``"64:256"`` (uniform, both ends included)."""
        low, colon, high = text.partition(":")
        try:
            bounds = int(low), int(high) if colon else int(low)
        except ValueError:
            raise WorkloadError(f"a length is N or LOW:HIGH, not {text!r}") from None
        return cls(*bounds)  # its own checks say what is wrong with the numbers

    def draw(self, rng: random.Random) -> int:
        """One length."""
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that decides the request sequence.

    ``prompt_lengths`` is the length after the shared prefix (the whole prompt without groups);
    ``prompts`` (from a file) replace synthetic prompts and are sent in a seeded shuffled order,
    each once per pass. ``request_rate`` (requests/s, ``inf`` for all at once) gives every request
    an arrival time; ``burstiness`` is the gamma shape of the inter-arrival times (1 is Poisson).
    """

    seed: int = 0
    prompt_lengths: Lengths = Lengths(128, 128)
    output_lengths: Lengths = Lengths(64, 64)
    prefix_groups: int = 0
    prefix_length: int = 0
    vocab_size: int | None = None
    prompts: tuple[PromptEntry, ...] = field(default=(), repr=False)
    request_rate: float | None = None
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.prefix_groups < 0 or self.prefix_length < 0:
            raise WorkloadError("prefix groups and prefix length cannot be negative")
        if bool(self.prefix_groups) != bool(self.prefix_length):
            raise WorkloadError("a shared-prefix workload needs both a number of groups and a prefix length")
        if self.vocab_size is not None and (self.vocab_size < 1 or self.prompts):
            raise WorkloadError("token-id prompts need a positive vocabulary size and no prompts file")
        if self.request_rate is not None and self.request_rate <= 0:
            raise WorkloadError("the request rate must be positive")
        if self.burstiness <= 0:
            raise WorkloadError("burstiness must be positive")
        if self.output_lengths.low < 1:
            raise WorkloadError("every request must ask for at least one output token")
        if self.prompt_lengths.low + self.prefix_length < 1 and not self.prompts:
            raise WorkloadError("every prompt needs at least one character or token")


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload: its index, prompt, output budget, prefix group and arrival."""

    index: int
    prompt: Prompt
    max_tokens: int
    group: int | None = None
    send_at: float | None = None
    """Seconds after the measured phase starts; ``None`` at a fixed concurrency."""


class Workload:
    """The request sequence of a spec, drawn on demand and kept, so every target gets the same one."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._drawn: list[BenchRequest] = []
        self._source = _requests(spec, random.Random(spec.seed))
        self._arrivals = (
            arrival_offsets(spec.request_rate, spec.burstiness, random.Random(f"{spec.seed}:arrivals"))
            if spec.request_rate is not None
            else None
        )

    def request(self, index: int) -> BenchRequest:
        """Request ``index`` (drawing the sequence up to it the first time)."""
        while len(self._drawn) <= index:
            request = next(self._source)
            if self._arrivals is not None:
                request = BenchRequest(
                    request.index, request.prompt, request.max_tokens, request.group, next(self._arrivals)
                )
            self._drawn.append(request)
        return self._drawn[index]

    def warmup(self, count: int) -> list[BenchRequest]:
        """``count`` requests shaped like the workload but drawn from another seed (so they warm
        the engine, not the prefix cache for the measured prompts), with no arrival times.

        A prompts file's prompts would be the measured ones: warm-up sends synthetic text of the
        same lengths (and output lengths) instead.
        """
        rng = random.Random(f"{self.spec.seed}:warmup")
        spec = self.spec
        if spec.prompts:
            stand_ins = tuple(PromptEntry(synthetic_text(rng, len(p.text)), p.output_length) for p in spec.prompts)
            spec = replace(spec, prompts=stand_ins)
        return list(itertools.islice(_requests(spec, rng), count))


def _requests(spec: WorkloadSpec, rng: random.Random) -> Iterator[BenchRequest]:
    """The endless request sequence of ``spec`` drawn from ``rng``."""
    prefixes = [_synthetic(spec, rng, spec.prefix_length) for _ in range(spec.prefix_groups)]
    order: list[int] = []
    for index in itertools.count():
        group = index % spec.prefix_groups if prefixes else None
        output_length: int | None = None
        if spec.prompts:
            if not order:
                order = list(range(len(spec.prompts)))
                rng.shuffle(order)
            entry = spec.prompts[order.pop()]
            prompt: Prompt = entry.text
            output_length = entry.output_length
        else:
            prompt = _synthetic(spec, rng, spec.prompt_lengths.draw(rng))
        if group is not None:
            prompt = _join(prefixes[group], prompt)
        max_tokens = output_length if output_length is not None else spec.output_lengths.draw(rng)
        yield BenchRequest(index, prompt, max_tokens, group)


def _synthetic(spec: WorkloadSpec, rng: random.Random, length: int) -> Prompt:
    if spec.vocab_size is None:
        return synthetic_text(rng, length)
    return tuple(rng.randrange(spec.vocab_size) for _ in range(length))


def _join(prefix: Prompt, body: Prompt) -> Prompt:
    """``prefix`` then ``body``: both text or both token ids, as the spec's checks guarantee."""
    if isinstance(prefix, str):
        assert isinstance(body, str)
        return prefix + body
    assert isinstance(body, tuple)
    return prefix + body


__all__ = ["BenchRequest", "Lengths", "Prompt", "Workload", "WorkloadSpec"]
