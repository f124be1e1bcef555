"""What real SGLang does to the process hosting it: SIGTERM, child processes and logging (GPU only)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

pytest.importorskip("sglang")

from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_backends.sglang.process import process_alive
from openengine_gateway import pb
from openengine_gateway.testing import serve_backends

from tests.backends.sglang.drain import check_drain_under_load
from tests.engines.streams import MODEL, generate_request
from tests.process import gateway_process
from tests.responses import collect, finished
from tests.root_log import root_lines

from .conftest import option_flags, server_options

pytestmark = pytest.mark.sglang


def children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from ``/proc``)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found |= {int(child), *children(int(child))}
    return found


async def test_sigterm_ends_a_real_sglang_gateway_with_exit_0_and_no_process_left(
    tiny_model: Path, tmp_path: Path
) -> None:
    flags = option_flags(server_options())
    args = ("--backend", "sglang", "--model", str(tiny_model), "--served-model-name", MODEL, *flags)
    async with gateway_process(*args, cwd=tmp_path, startup_s=300.0) as gateway:
        async with grpc.aio.insecure_channel(gateway.address) as channel:
            responses = await collect(pb.OpenEngineStub(channel), generate_request("one", prompt="hello"))
        assert 0 in finished(responses)
        spawned = children(gateway.process.pid)
        assert spawned, "SGLang's scheduler and detokenizer run as children of the gateway"
        assert await gateway.stop() == 0
    assert not [pid for pid in spawned if process_alive(pid)], "no SGLang process outlives the gateway"


async def test_sigterm_under_load_drains_a_real_sglang_gateway(tiny_model: Path, tmp_path: Path) -> None:
    """SGLang's tokenizer manager puts its own SIGTERM handler on the loop when it starts; the gateway's is
    put back: streams in flight at the signal complete, a request after it is refused, exit 0."""
    flags = option_flags(server_options())
    args = ("--backend", "sglang", "--model", str(tiny_model), "--served-model-name", MODEL, *flags)
    async with gateway_process(*args, cwd=tmp_path, startup_s=300.0) as gateway:
        await check_drain_under_load(gateway, MODEL, tokens=400)  # seconds of decoding without CUDA graphs


async def test_the_gateways_logging_survives_a_real_sglang_start(tiny_model: Path) -> None:
    options = {k: v for k, v in server_options().items() if k != "log_level"}
    with root_lines(logging.INFO) as captured:
        async with serve_backends([(MODEL, SglangBackend(SglangSettings(model=str(tiny_model), **options)))]):
            logging.getLogger("openengine_backends.sglang").info("after the start")
            root = logging.getLogger()
            assert captured in root.handlers and root.level == logging.INFO
    assert "after the start" in captured.lines
