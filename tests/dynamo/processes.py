"""NVIDIA Dynamo 1.6.1's own processes (``.venv-dynamo``, built by ``make .venv-dynamo``) around a gateway.

One ``Deployment`` is one Dynamo deployment without etcd or NATS: file discovery in a directory of
its own (``DYN_DISCOVERY_BACKEND=file``), the TCP request plane, every socket on loopback. Each
process leads a process group of its own and is killed with it when its context ends; every wait is
bounded and a failed one quotes the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-dynamo"
PYTHON = VENV / "bin" / "python"
GRPCURL = VENV / "bin" / "grpcurl"
DRIVE = Path(__file__).with_name("drive.py")

READY_S = 180.0
"""Registration, discovery and a first answer: seconds on an idle machine, much longer while vLLM's CPU
worker busy-polls both cores of a 2-core CI machine."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def require_dynamo() -> None:
    """Skip where ``.venv-dynamo`` was not built (``make test`` builds it first, so CI never skips)."""
    if not (VENV / ".installed").exists():
        pytest.skip("NVIDIA Dynamo 1.6.1 is not installed here: `make .venv-dynamo` (`make test` does it first)")


def tail(log: Path, lines: int = 40) -> str:
    """The end of a process's log, without its colour codes."""
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])


async def wait_until(ready: Callable[[], Awaitable[Any]], within_s: float, what: str, *logs: Path) -> Any:
    """Poll ``ready`` until it returns something truthy; fail with ``what`` and the logs' ends after ``within_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not (result := await ready()):
        if loop.time() > deadline:
            quoted = "\n".join(f"--- {log.name}\n{tail(log)}" for log in logs)
            raise AssertionError(f"{what}: not within {within_s:.0f}s\n{quoted}")
        await asyncio.sleep(0.25)
    return result


@dataclass
class Deployment:
    """The directory one Dynamo deployment discovers its workers in, its logs and its processes' environment."""

    directory: Path

    @property
    def discovery(self) -> Path:
        return self.directory / "discovery"

    def env(self) -> dict[str, str]:
        """File discovery, the TCP request plane, loopback sockets; ``HOME`` here (the frontend caches
        model cards under ``~/.cache/dynamo``)."""
        return {
            **os.environ,
            "HOME": str(self.directory),
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(self.discovery),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        }

    @contextlib.asynccontextmanager
    async def process(self, name: str, *args: str) -> AsyncIterator[Path]:
        """Run ``.venv-dynamo/bin/python ARGS`` in the directory until the context ends; yield its log."""
        log = self.directory / f"{name}.log"
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                str(PYTHON),
                *args,
                cwd=self.directory,
                env=self.env(),
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        try:
            yield log
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    @contextlib.asynccontextmanager
    async def sidecar(self, gateway: str, model_path: str) -> AsyncIterator[dict[str, Any]]:
        """Dynamo's TensorRT-LLM sidecar registering the gateway at ``gateway`` as a worker; yield the model
        card it registered (``context_length`` and the rest, as Dynamo's frontend reads it).

        ``model_path`` is a directory in the deployment's directory named as the gateway serves the model:
        the sidecar asks GetModelInfo for the model by the name it was given as ``--model-path``. It offers
        completions only: a tokenizer-only directory has no chat template, without which Dynamo's frontend
        refuses to serve a chat model at all."""
        args = ("-m", "dynamo.trtllm.sidecar", "--grpc-endpoint", gateway, "--model-path", model_path)
        async with self.process("sidecar", *args, "--endpoint-types", "completions") as log:
            yield await wait_until(lambda: self._card(model_path), READY_S, "the sidecar registers the model", log)

    async def _card(self, model: str) -> dict[str, Any] | None:
        for path in (self.discovery / "v1" / "mdc").glob("*"):
            card: dict[str, Any] = json.loads(path.read_text())["card_json"]
            if card["display_name"] == model:
                return card
        return None

    @contextlib.asynccontextmanager
    async def frontend(self, port: int, model: str) -> AsyncIterator[str]:
        """Dynamo's OpenAI frontend on ``127.0.0.1:port``, once it lists ``model``; yield its base URL."""
        url = f"http://127.0.0.1:{port}"
        args = ("--discovery-backend", "file", "--request-plane", "tcp", "--http-host", "127.0.0.1")
        async with self.process("frontend", "-m", "dynamo.frontend", *args, "--http-port", str(port)) as log:

            async def listed() -> bool:
                try:
                    models = await asyncio.to_thread(http_json, f"{url}/v1/models")
                except OSError:
                    return False
                return any(entry["id"] == model for entry in models["data"])

            await wait_until(listed, READY_S, f"the frontend lists {model!r}", log)
            yield url

    async def drive(self, request: dict[str, Any], *, stop_after: int | None = None) -> list[dict[str, Any]]:
        """Send ``request`` (a ``PreprocessedRequest``) through Dynamo's request plane with ``drive.py``;
        return the worker's responses (``LLMEngineOutput``) in order."""
        stop = ("--stop-after", str(stop_after)) if stop_after else ()
        log = self.directory / "drive.log"
        with log.open("ab") as errors:
            process = await asyncio.create_subprocess_exec(
                str(PYTHON),
                str(DRIVE),
                json.dumps(request),
                *stop,
                cwd=self.directory,
                env={**self.env(), "DYN_LOG": "warn"},
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
                start_new_session=True,
            )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), READY_S)
        except TimeoutError:
            raise AssertionError(f"drive.py did not end within {READY_S:.0f}s\n{tail(log)}") from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == 0, f"drive.py exited {process.returncode}\n{tail(log)}"
        lines = [json.loads(line) for line in output.decode().splitlines()]
        assert lines and lines[-1] == {"end": len(lines) - 1}, lines[-3:]
        return lines[:-1]


def http_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = READY_S) -> Any:
    """GET ``url`` (or POST ``body`` as JSON) and parse the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def tokens_and_usage(responses: list[dict[str, Any]]) -> tuple[list[int], str | None, dict[str, Any]]:
    """A worker's streamed token ids, its finish reason and its usage (on the last response)."""
    tokens = [token for response in responses for token in response["token_ids"]]
    return tokens, responses[-1]["finish_reason"], responses[-1].get("completion_usage") or {}
