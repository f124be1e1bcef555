"""Servers under test in their own processes, with the CPU time and memory the kernel charges them.

Each server is started as a child that prints its address on a line of its own; its CPU time
(user + system, every thread, from ``/proc/<pid>/stat``), that of its whole process tree (a vLLM server's
engine core and worker are its children) and its resident memory (``/proc/<pid>/status``) are read around
a measurement, so a server's cost per message is what the kernel counted, not an estimate. Linux only,
like the machines the figures are reported for.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_ADDRESS = re.compile(r"(127\.0\.0\.1:\d+)")


class Server:
    """A child process serving until ``stop``; ``address`` is the ``host:port`` it printed.

    Its output goes to ``log`` (a file, so a chatty server never blocks on a full pipe).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        ready: str,
        timeout_s: float = 300.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``argv`` (with ``env`` added to this environment) and wait (up to ``timeout_s``) for an output
        line containing ``ready`` and an address."""
        self.name = name
        self.log = log
        environment = {**os.environ, **(env or {})}
        with log.open("w") as output:
            self._process = subprocess.Popen(
                list(argv), cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, env=environment
            )
        self.address = self._wait(ready, timeout_s)

    def _wait(self, ready: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._process.poll() is None:
            for line in self.log.read_text(errors="replace").splitlines():
                match = _ADDRESS.search(line)
                if ready in line and match:
                    return match.group(1)
            time.sleep(0.2)
        self.stop()
        tail = "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"{self.name} did not start (log {self.log}):\n{tail}")

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._process.pid

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the child has used so far."""
        return cpu_s(self.pid)

    def tree_cpu_s(self) -> float:
        """CPU seconds the child and every live process below it have used so far."""
        return tree_cpu_s(self.pid)

    def rss_bytes(self) -> int:
        """The child's resident memory now."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for {self.name}")

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 30 s), then any process it started that outlived it."""
        if self._process.poll() is None:
            below = descendants(self.pid)
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            for pid in below:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                children.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` and every live process below it have used so far (one that exits meanwhile is
    charged to its parent only once reaped: the servers measured keep theirs alive)."""
    total = cpu_s(pid)
    for each in descendants(pid):
        with contextlib.suppress(OSError):
            total += cpu_s(each)
    return total


def python(*args: str) -> list[str]:
    """argv running this interpreter (the project's virtualenv) with ``args``."""
    return [sys.executable, *args]


__all__ = ["ROOT", "Server", "cpu_s", "descendants", "python", "tree_cpu_s"]
