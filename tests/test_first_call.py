"""The README's first completion (examples/first_call.py) works against the real command."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.process import gateway_process

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "first_call.py"


async def test_the_first_call_completes_against_a_running_gateway(tmp_path: Path) -> None:
    async with gateway_process("--backend", "mock", cwd=tmp_path) as gateway:
        call = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLE), gateway.address, stdout=asyncio.subprocess.PIPE
        )
        output, _ = await asyncio.wait_for(call.communicate(), 60)
        assert await gateway.stop() == 0
    assert call.returncode == 0
    engine, completion = output.decode().splitlines()
    assert engine.startswith("mock ") and completion.endswith(" 16 tokens")
