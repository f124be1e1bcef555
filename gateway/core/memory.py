"""The process's memory budget: new work is shed before the memory in use reaches it.

As Envoy's overload manager does with its heap monitor, the gateway reads the memory it
actually holds (its resident set, ``/proc/self/statm``) rather than estimating what each
request costs, and refuses new work from a threshold below the budget (``SHED_FRACTION``), so
that the work already admitted can finish inside it. A refusal is RESOURCE_EXHAUSTED with a
``retry-after-ms`` hint: memory comes back as streams end, and another replica may have room.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import ResourceExhausted

SHED_FRACTION = 0.9
"""New work is refused once resident memory reaches this fraction of the budget."""
RETRY_AFTER_MS = 1000
"""The hint a shed request gets: memory comes back as running streams end, in about a second or more."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``; 0 where there is no /proc)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


class MemoryBudget:
    """``limit_bytes`` of resident memory for the process (None: no budget, nothing is shed)."""

    def __init__(self, limit_bytes: int | None, read: Callable[[], int] = resident_bytes) -> None:
        self.limit_bytes = limit_bytes
        self._read = read
        self.shed = 0
        """Work refused for memory since start (``openengine_gateway_memory_shed_total``)."""

    @property
    def resident(self) -> int:
        """The memory in use now."""
        return self._read()

    def check(self, what: str = "request") -> None:
        """Refuse new work (``what``) with RESOURCE_EXHAUSTED once the memory in use reaches the threshold."""
        limit = self.limit_bytes
        if limit is None:
            return
        used = self._read()
        if used >= limit * SHED_FRACTION:
            self.shed += 1
            raise ResourceExhausted(
                f"the gateway is shedding new work: {used // 2**20} MiB in use, past {SHED_FRACTION:.0%} of its "
                f"{limit // 2**20} MiB memory budget (--max-memory-mib); a new {what} is refused until running "
                "work ends",
                retry_after_ms=RETRY_AFTER_MS,
            )


__all__ = ["RETRY_AFTER_MS", "SHED_FRACTION", "MemoryBudget", "resident_bytes"]
