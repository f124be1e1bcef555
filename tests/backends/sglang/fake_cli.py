"""``openengine-gateway`` with the fake SGLang installed as ``sglang``, for tests of the real command.

``python -m tests.backends.sglang.fake_cli ARGS`` (from the repository root) runs the gateway's own
``main`` in a process of its own, where the fake may act on the process as SGLang does: its SIGQUIT
handler really kills it.
"""

from __future__ import annotations

import sys

import pytest
from openengine_gateway.cli import main

from . import fake_engine
from .fake_api import install

if __name__ == "__main__":
    install(pytest.MonkeyPatch())
    fake_engine.OWN_PROCESS = True
    fake_engine.STEP_S = 0.02  # streams stay in flight long enough to be signalled
    sys.exit(main(sys.argv[1:]))
