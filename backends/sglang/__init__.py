"""The SGLang driver: SGLang's offline ``Engine`` behind the OpenEngine contract.

Registered as the ``sglang`` entry point of ``openengine.backends``. Importing this package does
not import SGLang (it needs CUDA and takes seconds); the engine module imports it when an engine
starts.
"""

from .engine import SglangBackend
from .settings import SglangSettings

__all__ = ["SglangBackend", "SglangSettings"]
