"""Request arrival times: a gamma renewal process, as vLLM's serving benchmark draws them.

Inter-arrival times are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``:
burstiness 1 is a Poisson process, below 1 arrivals come in bursts, above 1 they are more regular.
An infinite rate sends every request at once.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator


def arrival_offsets(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Endless arrival times in seconds from the start, the first after one gap (0 when ``rate`` is inf)."""
    if math.isinf(rate):
        return itertools.repeat(0.0)
    return itertools.accumulate(rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in itertools.count())


__all__ = ["arrival_offsets"]
