"""How the benchmarks print: a machine header, aligned figures, and PASS/FAIL beside each target."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from importlib import metadata


def _memory_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    return float("nan")


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def header(title: str, packages: tuple[str, ...] = ("grpcio", "protobuf")) -> None:
    """Print what was measured, where and when."""
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in packages)
    print(f"== {title}")
    print(f"   date     {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"   machine  {os.cpu_count()} CPUs ({_cpu_model()}), {_memory_gib():.0f} GiB, {platform.platform()}")
    print(f"   software Python {sys.version.split()[0]}, {versions}")
    one, five, fifteen = os.getloadavg()
    print(f"   load     average {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) at the start")


def section(title: str) -> None:
    """Print a section heading."""
    print(f"\n-- {title}")


def line(label: str, figure: str, verdict: str = "") -> None:
    """Print one figure, aligned, with an optional verdict."""
    print(f"   {label:<44} {figure:<52} {verdict}".rstrip())


def target(passed: bool, what: str) -> str:
    """``PASS (what)`` or ``FAIL (what)``."""
    return f"{'PASS' if passed else 'FAIL'} (target {what})"


def ms(seconds: float) -> str:
    """Seconds as milliseconds, 2 decimals."""
    return f"{seconds * 1e3:.2f} ms"


__all__ = ["header", "line", "ms", "section", "target"]
