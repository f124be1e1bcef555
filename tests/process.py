"""The real ``openengine-gateway`` command as a child process, for end-to-end tests.

    async with gateway_process("--backend", "mock", cwd=tmp_path) as gateway:
        async with await OpenEngineClient.connect(gateway.address) as client:
            ...
        assert await gateway.stop() == 0          # SIGTERM: drain, then exit 0

The gateway binds a free loopback port; the address comes from its startup line. Its log goes
to a file in ``cwd``, quoted in any failure. It leads a process group of its own, as a shell's
job does, so a test can send the group a terminal's Ctrl-C without signalling pytest; a group
still running on exit is killed, the engine processes in it included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_STARTED = re.compile(r"^openengine-gateway serving .* on (\S+) \((?:plaintext|TLS|mTLS)")  # not ", metrics on port N"
_logs = itertools.count()


def command() -> list[str]:
    """The installed ``openengine-gateway`` script next to this interpreter (else ``-m``)."""
    script = Path(sys.executable).with_name("openengine-gateway")
    return [str(script)] if script.exists() else [sys.executable, "-m", "openengine_gateway.cli"]


@dataclass
class GatewayProcess:
    """A started gateway process and where it listens."""

    process: asyncio.subprocess.Process
    address: str
    log: Path

    async def stop(self, signum: int = signal.SIGTERM, within_s: float = 30.0) -> int:
        """Signal the process and return its exit status."""
        self.process.send_signal(signum)
        return await asyncio.wait_for(self.process.wait(), within_s)


@contextlib.asynccontextmanager
async def gateway_process(
    *args: str, cwd: Path, startup_s: float = 60.0, program: Sequence[str] | None = None
) -> AsyncIterator[GatewayProcess]:
    """Run ``openengine-gateway ARGS --host 127.0.0.1 --port 0`` in ``cwd`` until it serves.

    ``program`` replaces the installed command (a wrapper that installs a fake engine first)."""
    log = cwd / f"gateway-{next(_logs)}.log"
    env = {k: v for k, v in os.environ.items() if k != "OPENENGINE_GATEWAY_CONFIG"}
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *(program or command()),
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            cwd=cwd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        address = await asyncio.wait_for(_address(process, log), startup_s)
        yield GatewayProcess(process, address, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def _address(process: asyncio.subprocess.Process, log: Path) -> str:
    assert process.stdout is not None
    while line := (await process.stdout.readline()).decode():
        if match := _STARTED.match(line):
            return match.group(1)
    await process.wait()
    output = await asyncio.to_thread(log.read_text)
    raise AssertionError(f"the gateway exited ({process.returncode}) before serving:\n{output}")


__all__ = ["GatewayProcess", "command", "gateway_process"]
