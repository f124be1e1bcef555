"""The TensorRT-LLM driver: TensorRT-LLM's ``LLM`` (PyTorch backend) behind the OpenEngine contract.

Registered as the ``trtllm`` entry point of ``openengine.backends``. Importing this package does
not import TensorRT-LLM (it needs a GPU build and takes seconds); the engine module imports it
when an engine starts. Written against TensorRT-LLM 1.2 (``tensorrt-llm==1.2.1``).
"""

from .engine import TrtllmBackend
from .settings import TrtllmSettings

__all__ = ["TrtllmBackend", "TrtllmSettings"]
