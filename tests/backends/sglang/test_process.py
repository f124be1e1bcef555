"""What SGLang does to the process that hosts it: one engine per gateway, logging, SIGQUIT and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import types
from pathlib import Path

import grpc
import pytest
from openengine_gateway import pb
from openengine_gateway.config import Config, EngineSection
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.launch import plan_engines

from tests.process import gateway_process
from tests.root_log import root_lines

from ..fake_serving import serving
from . import fake_engine
from .conftest import request, sglang
from .drain import check_drain_under_load


def test_an_sglang_engine_beside_another_is_refused_naming_the_alternative() -> None:
    """SGLang's configuration is process-wide and its shutdown kills every child of the gateway."""
    for other in ("sglang", "mock"):
        sections = [EngineSection(backend="sglang", options={"model": "org/model"}), EngineSection(backend=other)]
        with pytest.raises(ConfigurationError, match=r"engines\[0\] \(sglang\): .*only engine.*`remote` backend"):
            plan_engines(sections, Config())
    plan_engines([EngineSection(backend="sglang", options={"model": "org/model"})], Config())  # alone, it is served


async def test_the_testing_kit_refuses_it_too_before_anything_starts(fake: types.ModuleType) -> None:
    with pytest.raises(ConfigurationError, match="only engine of its gateway"):
        async with serving(sglang(disaggregation_mode="prefill"), sglang(disaggregation_mode="decode")):
            pass
    assert fake_engine.ENGINES == []


async def test_the_gateways_logging_survives_sglangs_start(fake: types.ModuleType) -> None:
    """SGLang's ``configure_logger`` replaces the root logger's handlers and sets "error" unless told."""
    with root_lines(logging.INFO) as captured:
        async with serving(sglang()):
            logging.getLogger("openengine_backends.sglang").info("after the start")
        root = logging.getLogger()
        assert captured in root.handlers and root.level == logging.INFO
    assert "after the start" in captured.lines
    assert fake_engine.ENGINES[0].server_args["log_level"] == "info", "SGLang logs at the operator's level"


async def test_a_failed_sglang_process_makes_the_engine_not_ready_and_spares_the_gateway(
    fake: types.ModuleType,
) -> None:
    async with serving(sglang()) as running:
        fake_engine.ENGINES[0].fail_child()  # SGLang's watchdog: SIGQUIT to the gateway's process
        for _ in range(300):
            health = await running.stub.Health(pb.HealthRequest())
            if health.state == pb.HEALTH_STATE_NOT_READY:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await running.stub.Generate(request()).read()
    assert fake_engine.PROCESS_TREE_KILLED == []
    assert health.state == pb.HEALTH_STATE_NOT_READY
    assert any("SIGQUIT" in check.message for check in health.checks)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert fake_engine.ENGINES[0].shut_down, "SGLang's remaining processes are stopped"


ROOT = Path(__file__).resolve().parents[3]
FAKE_CLI = [
    sys.executable,
    "-c",
    f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); "
    "runpy.run_module('tests.backends.sglang.fake_cli', run_name='__main__', alter_sys=True)",
]


async def test_the_real_command_survives_sglangs_sigquit_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    args = ("--backend", "sglang", "--model", str(tmp_path), "--config", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    async with gateway_process(*args, cwd=tmp_path, program=FAKE_CLI) as gateway:
        gateway.process.send_signal(signal.SIGQUIT)  # what SGLang's watchdog sends when a child fails
        channel = grpc.aio.insecure_channel(gateway.address)
        stub = pb.OpenEngineStub(channel)
        for _ in range(300):
            health = await stub.Health(pb.HealthRequest())
            if health.state == pb.HEALTH_STATE_NOT_READY:
                break
            await asyncio.sleep(0.01)
        await channel.close()
        assert health.state == pb.HEALTH_STATE_NOT_READY
        assert await gateway.stop() == 0
    assert "ERROR openengine_backends.sglang.engine: an SGLang subprocess failed" in gateway.log.read_text()


async def test_sigterm_under_load_drains_through_the_gateways_own_handler(tmp_path: Path) -> None:
    """SGLang's ``auto_create_handle_loop`` puts its SIGTERM handler on the loop, which only sets
    ``gracefully_exit``: the gateway's own, put back once the engine started, drains."""
    args = ("--backend", "sglang", "--model", str(tmp_path), "--config", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    async with gateway_process(*args, cwd=tmp_path, program=FAKE_CLI) as gateway:
        await check_drain_under_load(gateway, str(tmp_path))
    assert fake_engine.PROCESS_TREE_KILLED == []


async def test_a_failed_output_loop_ends_the_engine_and_spares_the_gateway(
    fake: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's ``print_exception_wrapper`` kills the process tree when its output loop raises."""
    monkeypatch.setattr(fake_engine, "STEP_S", 0.02)
    stopping = pb.StoppingOptions(max_tokens=100, ignore_eos=True)
    async with serving(sglang()) as running:
        call = running.stub.Generate(request(stopping=stopping))
        await call.read()
        fake_engine.ENGINES[0].tokenizer_manager.fail_output_loop()
        responses = []
        while (response := await call.read()) is not grpc.aio.EOF:
            responses.append(response)
        health = await running.stub.Health(pb.HealthRequest())
    assert fake_engine.PROCESS_TREE_KILLED == []
    assert responses[-1].WhichOneof("event") == "error", responses[-1]
    assert responses[-1].error.retryable
    assert health.state == pb.HEALTH_STATE_NOT_READY
    assert any("tokenizer manager failed" in check.message for check in health.checks)


async def test_sglangs_processes_log_through_the_gateway_so_json_logs_stay_json(tmp_path: Path) -> None:
    """SGLang's scheduler inherits the gateway's stderr and prints its own text lines there."""
    args = ("--backend", "sglang", "--model", str(tmp_path), "--config", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    async with gateway_process(*args, "--log-format", "json", cwd=tmp_path, program=FAKE_CLI) as gateway:
        for _ in range(100):  # the scheduler's second line comes after the gateway serves
            if "Decode batch" in gateway.log.read_text():
                break
            await asyncio.sleep(0.05)
        assert await gateway.stop() == 0
    entries = [json.loads(line) for line in gateway.log.read_text().splitlines()]
    scheduler = [e["message"] for e in entries if e["logger"] == "sglang.processes"]
    assert [m.split("] ")[1].split(",")[0] for m in scheduler] == ["Prefill batch", "Decode batch"], entries
