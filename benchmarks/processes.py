"""Servers under test in their own processes, with the CPU time and memory the kernel charges them.

Each server is started as a child that prints its address on a line of its own; its CPU time
(user + system, every thread, from ``/proc/<pid>/stat``) and resident memory (``/proc/<pid>/status``)
are read around a measurement, so a server's cost per message is what the kernel counted, not an
estimate. Linux only, like the machines the figures are reported for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_ADDRESS = re.compile(r"(127\.0\.0\.1:\d+)")


class Server:
    """A child process serving until ``stop``; ``address`` is the ``host:port`` it printed.

    Its output goes to ``log`` (a file, so a chatty server never blocks on a full pipe).
    """

    def __init__(self, name: str, argv: Sequence[str], *, log: Path, ready: str, timeout_s: float = 300.0) -> None:
        """Start ``argv`` and wait (up to ``timeout_s``) for an output line containing ``ready`` and an address."""
        self.name = name
        self.log = log
        with log.open("w") as output:
            self._process = subprocess.Popen(list(argv), cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
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
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S

    def rss_bytes(self) -> int:
        """The child's resident memory now."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for {self.name}")

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 30 s)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def python(*args: str) -> list[str]:
    """argv running this interpreter (the project's virtualenv) with ``args``."""
    return [sys.executable, *args]


__all__ = ["ROOT", "Server", "python"]
