"""Splits changed without a restart, end to end: the real command serving two mock engines and a split
from plugins.toml, its weights edited, then SIGHUP (and ``openengine-gateway routes --reload``)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from openengine_gateway import routes_pb

from tests.process import GatewayProcess, command, gateway_process

CONTROL, INFERENCE = "control-token-0123", "inference-token-4567"
ENGINES = """
[[engines]]
backend = "mock"
served_model_name = "a"

[[engines]]
backend = "mock"
served_model_name = "b"
"""


def _file(a: int, b: int) -> str:
    return ENGINES + f'\n[[splits]]\nname = "ab"\nengines = {{ a = {a}, b = {b} }}\n'


async def _weights(gateway: GatewayProcess) -> list[tuple[str, int]]:
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        routes = await routes_pb.RoutesStub(channel).GetRoutes(
            routes_pb.GetRoutesRequest(), metadata=(("authorization", f"Bearer {INFERENCE}"),), timeout=10
        )
    return [(engine.engine, engine.weight) for split in routes.splits for engine in split.engines]


async def _until(what: str, check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {within_s}s")
        await asyncio.sleep(0.05)


async def _routes_command(gateway: GatewayProcess, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *command(),
        "routes",
        "--target",
        gateway.address,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_sighup_and_the_routes_command_change_the_weights_while_serving(tmp_path: Path) -> None:
    config = tmp_path / "plugins.toml"
    config.write_text(_file(3, 1))
    (tmp_path / "control").write_text(f"operator {CONTROL}\n")
    (tmp_path / "tokens").write_text(f"tenant {INFERENCE}\n")
    for path in (tmp_path / "control", tmp_path / "tokens"):
        path.chmod(0o600)
    flags = ("--config", str(config), "--control-token-file", "control", "--auth-token-file", "tokens")
    async with gateway_process(*flags, cwd=tmp_path) as gateway:
        assert await _weights(gateway) == [("a", 3), ("b", 1)]

        config.write_text(_file(1, 3))
        gateway.process.send_signal(signal.SIGHUP)

        async def reweighted() -> bool:
            return await _weights(gateway) == [("a", 1), ("b", 3)]

        await _until("the SIGHUP reload", reweighted)
        audit = f"audit: reload of routes from {config}: split 'ab': weight of a 3 -> 1, weight of b 1 -> 3 by SIGHUP"

        async def audited() -> bool:
            return audit in gateway.log.read_text()

        await _until("the audit line", audited)

        config.write_text(_file(1, 3).replace("b = 3", "nope = 3"))
        gateway.process.send_signal(signal.SIGHUP)

        async def warned() -> bool:
            return "SIGHUP: routes not reloaded, the old ones still serve" in gateway.log.read_text()

        await _until("the refusal's warning", warned)
        assert await _weights(gateway) == [("a", 1), ("b", 3)]
        assert gateway.process.returncode is None

        config.write_text(_file(2, 2))
        code, out, err = await _routes_command(gateway, "--reload", "--token", INFERENCE)
        assert code == 1 and "PERMISSION_DENIED" in err, (out, err)
        code, out, err = await _routes_command(gateway, "--reload", "--token", CONTROL)
        assert code == 0, err
        assert out.splitlines()[:2] == ["reloaded:", "  split 'ab': weight of a 1 -> 2, weight of b 3 -> 2"]
        code, out, _ = await _routes_command(gateway, "--token", INFERENCE)
        assert code == 0 and out.splitlines() == [
            "split ab, sticky by metadata.session, cache_salt",
            "  a  weight    2   50.0%",
            "  b  weight    2   50.0%",
        ]
        assert await gateway.stop() == 0
    assert "by token 'operator' from" in gateway.log.read_text()


async def test_the_routes_command_shows_and_controls_a_canary_and_sighup_pauses_it(tmp_path: Path) -> None:
    config = tmp_path / "plugins.toml"
    analysis = '\n[splits.analysis]\nbaseline = "a"\ncandidate = "b"\nsteps = [10, 100]\nstep_s = 3600\n'
    config.write_text(_file(1, 0) + analysis)
    (tmp_path / "control").write_text(f"operator {CONTROL}\n")
    (tmp_path / "control").chmod(0o600)
    async with gateway_process("--config", str(config), "--control-token-file", "control", cwd=tmp_path) as gateway:
        assert await _weights(gateway) == [("a", 90), ("b", 10)]  # the canary's first step, not the file's weights
        code, out, _ = await _routes_command(gateway)
        assert code == 0 and out.splitlines()[3:] == [
            "  canary running: b against a at 10%, steps [10], 100",
            "    started at step 1: b at 10%",
        ]
        code, _, err = await _routes_command(gateway, "--canary", "ab", "pause")
        assert code == 1 and "UNAUTHENTICATED" in err  # no control token

        config.write_text(_file(1, 0) + analysis + "paused = true\n")
        gateway.process.send_signal(signal.SIGHUP)

        async def paused() -> bool:
            return "canary of split 'ab': paused by a reload" in gateway.log.read_text()

        await _until("the reload's pause", paused)
        code, out, err = await _routes_command(gateway, "--canary", "ab", "promote", "--token", CONTROL)
        assert code == 0, err
        assert "  canary promoted: b against a at 100%, steps [10], 100" in out.splitlines()
        assert await _weights(gateway) == [("a", 0), ("b", 100)]
        code, _, err = await _routes_command(gateway, "--canary", "ab", "abort", "--token", CONTROL)
        assert code == 1 and "FAILED_PRECONDITION" in err and "has ended (promoted)" in err
        code, _, err = await _routes_command(gateway, "--canary", "ab", "restart")
        assert code == 2 and "ACTION is one of pause, resume, promote, abort" in err
        assert await gateway.stop() == 0
    log = gateway.log.read_text()
    assert "audit: canary of split 'ab': promoted by token 'operator' from" in log
