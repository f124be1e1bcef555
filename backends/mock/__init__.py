"""The ``mock`` backend: a simulated inference engine that runs every part of the contract on a CPU.

In the spirit of NVIDIA Dynamo's mocker, nothing is a fixed answer: a byte-level tokenizer,
a seeded pseudo-model with a real distribution at every position (so sampling knobs,
logprobs and guided decoding act for real), continuous batching with a KV block manager and
prefix cache that publishes KV events, prefill/decode roles with a loopback KV transfer,
LoRA adapters, and Embed/Classify/Score. Every capability can be switched off in
``MockSettings`` to exercise the gateway's rejection paths.
"""

from .backend import MockBackend
from .settings import MockSettings

__all__ = ["MockBackend", "MockSettings"]
