"""The gateway's process on SGLang's real tokenizer side: SIGTERM drains, SGLang's exits end only the engine.

SGLang's ``TokenizerManager.auto_create_handle_loop`` (``managers/tokenizer_manager.py``) puts its own
SIGTERM and SIGQUIT handlers on the loop and runs its output loop and SIGTERM watchdog there under
``print_exception_wrapper``. These tests run that real code on the gateway's loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from openengine_backends.sglang import SglangBackend, SglangSettings
from openengine_gateway import pb

from tests.process import gateway_process

from ...fake_serving import MODEL, serving
from ..drain import check_drain_under_load
from .cpu_engine import STARTED, CpuEngine

ROOT = Path(__file__).resolve().parents[4]
CPU_CLI = [
    sys.executable,
    "-c",
    f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); "
    "runpy.run_module('tests.backends.sglang.real.cpu_cli', run_name='__main__', alter_sys=True)",
]


async def test_sigterm_under_load_drains_a_gateway_on_sglangs_real_tokenizer_manager(
    tiny_model: Path, tmp_path: Path
) -> None:
    (tmp_path / "none.toml").write_text("")
    args = ("--backend", "sglang", "--model", str(tiny_model), "--context-length", "256", "--device", "cpu")
    args += ("--config", str(tmp_path / "none.toml"))
    async with gateway_process(*args, cwd=tmp_path, program=CPU_CLI, startup_s=120) as gateway:
        await check_drain_under_load(gateway, str(tiny_model))
    log = gateway.log.read_text()
    assert "Traceback" not in log, log


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """``sglang.Engine`` on SGLang's real tokenizer side; the process-tree kills SGLang would do, recorded
    (``utils/common.py`` ``kill_process_tree`` as ``managers/tokenizer_manager.py`` imports it). The engine
    publishes its configuration process-wide; the other modules' is put back after the test."""
    import sglang
    from sglang.srt.managers import tokenizer_manager
    from sglang.srt.runtime_context import restore_context, snapshot_context

    killed: list[tuple[Any, ...]] = []
    monkeypatch.setattr(sglang, "Engine", CpuEngine)
    monkeypatch.setattr(tokenizer_manager, "kill_process_tree", lambda *args, **kwargs: killed.append(args))
    before = snapshot_context()
    try:
        yield killed
    finally:
        restore_context(before)
        while STARTED:
            STARTED.pop().close()


def driver(tiny_model: Path) -> SglangBackend:
    return SglangBackend(SglangSettings(model=str(tiny_model), context_length="256", device="cpu"))


async def read_all(call: Any) -> list[pb.GenerateResponse]:
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    return responses


async def test_a_failed_output_loop_ends_the_engine_and_spares_the_gateway(
    tiny_model: Path, on_cpu: list[tuple[Any, ...]]
) -> None:
    """SGLang's ``print_exception_wrapper`` around its output loop kills the process tree, parent included."""
    import zmq

    backend = driver(tiny_model)
    stopping = pb.StoppingOptions(max_tokens=100, ignore_eos=True)
    async with serving(backend) as running:
        call = running.stub.Generate(pb.GenerateRequest(model=MODEL, prompt="say", stopping=stopping))
        await call.read()
        malformed = zmq.Context.instance().socket(zmq.PUSH)  # what SGLang's output loop cannot decode
        malformed.connect(backend.engine.port_args.tokenizer_ipc_name)
        malformed.send(b"\xc1")
        responses = await read_all(call)
        health = await running.stub.Health(pb.HealthRequest())
        malformed.close(linger=0)
    assert on_cpu == []
    assert responses[-1].WhichOneof("event") == "error" and responses[-1].error.retryable, responses[-1]
    assert health.state == pb.HEALTH_STATE_NOT_READY
    assert any("tokenizer manager failed" in check.message for check in health.checks)


async def test_sglangs_sigterm_watchdog_ends_the_engine_not_the_process(
    tiny_model: Path, on_cpu: list[tuple[Any, ...]]
) -> None:
    """Were SGLang's own SIGTERM handler to run (``SignalHandler.sigterm_handler``), its watchdog drains its
    requests, then ends with ``sys.exit(0)``, a ``SystemExit`` out of the gateway's loop."""
    backend = driver(tiny_model)
    async with serving(backend) as running:
        manager = backend.engine.tokenizer_manager
        manager.signal_handler_class(manager).sigterm_handler()
        for _ in range(200):  # the watchdog looks every 5 s
            health = await running.stub.Health(pb.HealthRequest())
            if health.state == pb.HEALTH_STATE_NOT_READY:
                break
            await asyncio.sleep(0.05)
    assert health.state == pb.HEALTH_STATE_NOT_READY
    assert any("SIGTERM watchdog" in check.message for check in health.checks)
    assert on_cpu == [(os.getpid(),)], "SGLang's watchdog kills its own processes, never the gateway"


async def test_the_driver_leaves_sglangs_sigquit_handler_off_the_loop(tiny_model: Path, on_cpu: list[Any]) -> None:
    """``auto_create_handle_loop`` ran on this loop: SGLang's output loop and watchdog run there; SIGQUIT
    (SGLang's subprocess watchdog reporting a failed child) is the driver's."""
    backend = driver(tiny_model)
    async with serving(backend):
        manager = backend.engine.tokenizer_manager
        assert manager.event_loop is asyncio.get_running_loop()
        assert len(manager.asyncio_tasks) == 2 and not any(task.done() for task in manager.asyncio_tasks)
        os.kill(os.getpid(), signal.SIGQUIT)  # what SGLang's subprocess watchdog sends
        for _ in range(100):
            if (await backend.check_health())[0].state == pb.HEALTH_STATE_NOT_READY:
                break
            await asyncio.sleep(0.01)
    assert on_cpu == []
    assert (await backend.check_health())[0].state == pb.HEALTH_STATE_NOT_READY
