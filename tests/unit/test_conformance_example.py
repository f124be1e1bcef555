"""The conformance kit's docstring example, run as written (with the example plugin as the driver),
so a plugin author who copies it gets a test module that works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from openengine_gateway import conformance
from openengine_gateway.plugins import installed_backends

DRIVER_IMPORT = "from my_engine import MyBackend  # your driver"


@pytest.mark.skipif(
    "echo" not in {b.name for b in installed_backends()},
    reason="the example plugin is not installed (pip install ./examples/openengine-echo-backend)",
)
def test_the_docstring_example_runs(tmp_path: Path) -> None:
    doc = conformance.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    source = "\n".join(line.removeprefix("    ") for line in block.splitlines())
    assert DRIVER_IMPORT in source, "the example imports the author's driver"
    module = tmp_path / "test_example.py"
    module.write_text(source.replace(DRIVER_IMPORT, "from openengine_echo import EchoBackend as MyBackend"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-k", "health"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout.splitlines()[-1] and "failed" not in run.stdout.splitlines()[-1]
