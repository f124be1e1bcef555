"""The vLLM driver: vLLM's ``AsyncLLM`` behind the OpenEngine contract.

Registered as the ``vllm`` entry point of ``openengine.backends``. Importing this package does
not import vLLM (that takes seconds); the engine module imports it when an engine starts.
"""

from .engine import VllmBackend
from .settings import VllmSettings

__all__ = ["VllmBackend", "VllmSettings"]
