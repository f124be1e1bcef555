"""The ``openengine-gateway`` command end to end: real processes, real ports, SIGTERM.

Covers the paths only a process has: plugin discovery through installed entry points (a
third-party distribution included), the ``[plugins] allow`` list, flags to driver options, the
startup line, fan-out from one gateway process to another, a graceful stop with exit 0, and the
usage errors (exit 2) that must come before any engine starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from openengine_gateway.client import OpenEngineClient, text_request
from openengine_gateway.plugins import installed_backends

from tests.process import command, gateway_process


async def test_serves_mock_and_stops_gracefully(tmp_path: Path) -> None:
    async with gateway_process("--backend", "mock", "--served-model-name", "m", cwd=tmp_path) as gateway:
        async with await OpenEngineClient.connect(gateway.address) as client:
            completion = await client.generate(text_request("Hello", model="m", max_tokens=4))
        assert completion.outputs[0].tokens
        assert await gateway.stop() == 0


@pytest.mark.skipif(
    "echo" not in {b.name for b in installed_backends()},
    reason="the example plugin is not installed (pip install ./examples/openengine-echo-backend)",
)
async def test_a_third_party_plugin_from_its_own_distribution(tmp_path: Path) -> None:
    (echo,) = [b for b in installed_backends() if b.name == "echo"]
    assert echo.distribution == "openengine-echo-backend"  # a separate distribution, not this project
    config = tmp_path / "plugins.toml"
    config.write_text('[plugins]\nallow = ["echo"]\n')
    async with gateway_process("--backend", "echo", "--config", str(config), "--repeat", "2", cwd=tmp_path) as gateway:
        async with await OpenEngineClient.connect(gateway.address) as client:
            completion = await client.generate(text_request("abc", model="echo"))
        assert completion.outputs[0].text == "abcabc"
        assert await gateway.stop() == 0


async def test_a_plugin_outside_the_allow_list_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "plugins.toml"
    config.write_text('[plugins]\nallow = ["vllm"]\n')
    with pytest.raises(AssertionError, match="not allowed by the configuration"):
        async with gateway_process("--backend", "mock", "--config", str(config), cwd=tmp_path):
            pass


async def test_fan_out_to_a_gateway_in_another_process(tmp_path: Path) -> None:
    async with gateway_process("--backend", "mock", cwd=tmp_path) as back:
        front_args = ("--backend", "remote", "--target", back.address, "--served-model-name", "front")
        async with gateway_process(*front_args, cwd=tmp_path) as front:
            async with await OpenEngineClient.connect(front.address) as client:
                assert client.engine_info is not None and client.engine_info.engine_name == "mock"
                completion = await client.generate(text_request("Hello", model="front", max_tokens=4, seed=1))
            async with await OpenEngineClient.connect(back.address) as client:
                direct = await client.generate(text_request("Hello", model="mock-model", max_tokens=4, seed=1))
            assert completion.outputs[0].token_ids == direct.outputs[0].token_ids
            assert await front.stop() == 0
        assert await back.stop() == 0


def run_command(*args: str, cwd: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """The command to its exit, its output captured (for the ones that must fail before serving)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENENGINE_GATEWAY_CONFIG"}
    return subprocess.run([*command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_backends_into_a_pipe_its_reader_closed_ends_quietly(tmp_path: Path) -> None:
    """``openengine-gateway backends | head -1``: the reader has gone before the listing is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [*command(), "backends"], cwd=tmp_path, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (1, "")  # no BrokenPipeError traceback


def test_a_plugin_for_a_newer_spi_revision_is_refused_at_load_time(tmp_path: Path) -> None:
    """Exit 2, naming the plugin, its distribution and both revisions, before any engine starts."""
    (tmp_path / "oe_newer.py").write_text(
        "from openengine_backends.mock import MockBackend\n\n\nclass Newer(MockBackend):\n    spi_version = 99\n"
    )
    info = tmp_path / "oe_newer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: oe-newer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[openengine.backends]\nnewer = oe_newer:Newer\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENENGINE_GATEWAY_CONFIG"} | {"PYTHONPATH": str(tmp_path)}
    args = [*command(), "--backend", "newer", "--port", "0"]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert (
        "openengine-gateway: error: --backend newer: backend 'newer' from distribution oe-newer 1.0 targets backend "
        "SPI revision 99 "
        "(declared spi_version = 99); this gateway implements revision 2"
    ) in result.stderr
    assert "starting newer engine" not in result.stderr


def test_a_port_in_use_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = run_command("--backend", "mock", "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2
    assert f"openengine-gateway: error: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "starting mock engine" not in result.stderr


def test_a_model_path_that_does_not_exist_is_named_before_any_engine_starts(tmp_path: Path) -> None:
    result = run_command("--backend", "mock", "--model", "./no-such-model", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert f"model path './no-such-model' does not exist (relative to {tmp_path})" in result.stderr
    assert "starting mock engine" not in result.stderr


def test_an_unknown_backend_is_unknown_first_even_outside_the_allow_list(tmp_path: Path) -> None:
    (tmp_path / "plugins.toml").write_text('[plugins]\nallow = ["mock"]\n')
    result = run_command("--backend", "mokc", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown backend 'mokc' (did you mean 'mock'?); installed backends: " in result.stderr
    assert "not allowed" not in result.stderr
