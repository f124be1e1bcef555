"""``echo``: an example OpenEngine backend plugin, a deterministic engine that echoes its prompt.

Its model predicts the next character of the prompt with certainty: the output repeats the
prompt (``repeat`` times), then ends with the end-of-sequence token. Small on purpose, it
shows every part of a real driver: a settings model, a capability table that is the truth for
discovery and enforcement, synchronous pre-acceptance validation, an async generator of
events whose stopping and text come from the SPI's ``OutputTracker``, abort and load.
"""

from .backend import EchoBackend
from .settings import EchoSettings

__all__ = ["EchoBackend", "EchoSettings"]
