"""The real command on real vLLM stopped by a Ctrl-C in a terminal: SIGINT to the whole process group.

vLLM's engine core and worker get the SIGINT too and start exiting on their own; the gateway must
still stop them in order (``openengine_backends.vllm.shutdown``): exit 0, every vLLM process of the
group gone (none left defunct), no shared memory leaked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.process import gateway_process

pytestmark = pytest.mark.vllm


def group_members(pgid: int) -> list[str]:
    """``ps`` lines of every process (zombies included) in process group ``pgid``."""
    listing = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,comm="], capture_output=True, text=True, check=True)
    return [line for line in listing.stdout.splitlines() if int(line.split()[1]) == pgid]


async def test_ctrl_c_to_the_process_group_stops_vllm_in_order(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text('[plugins]\nallow = ["vllm"]\n')
    args = ("--backend", "vllm", "--model", str(tiny_model), "--enforce-eager", "--dtype", "float32")
    async with gateway_process(*args, cwd=tmp_path, startup_s=180) as gateway:
        pgid = os.getpgid(gateway.process.pid)
        assert pgid == gateway.process.pid, "the gateway leads a process group of its own"
        names = " ".join(line.split()[3] for line in group_members(pgid))
        assert "VLLM::EngineCor" in names and "VLLM::Worker" in names, names
        os.killpg(pgid, signal.SIGINT)
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0
        await asyncio.sleep(1)  # a process the gateway left behind would be exiting by now
        log = gateway.log.read_text()
        # vLLM's processes reaped by their parents, defunct ones included (checked before gateway_process
        # kills what is left); the gateway's own multiprocessing resource tracker exits after it, on its own.
        left = [line for line in group_members(pgid) if "VLLM" in line or line.split()[2][0] != "Z"]
        assert left == [], log[-4000:]
        assert "leaked shared_memory" not in log, log[-4000:]
