"""``openengine-gateway`` with ``sglang.Engine`` built on SGLang's real tokenizer side (``cpu_engine``).

``python -m tests.backends.sglang.real.cpu_cli ARGS`` (from the repository root, in ``.venv-sglang``)
runs the gateway's own ``main``: the command's start path, on SGLang's real ``TokenizerManager``.
"""

from __future__ import annotations

import sys

import sglang
from openengine_gateway.cli import main

from .cpu_engine import CpuEngine

if __name__ == "__main__":
    sglang.Engine = CpuEngine
    sys.exit(main(sys.argv[1:]))
