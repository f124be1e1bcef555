"""``EchoSettings``: the driver's options, from ``plugins.toml`` or ``--option value`` flags.

The base class forbids unknown keys, so a typo is an error that names the key; command-line
values arrive as strings and pydantic converts them (``--repeat 2``).
"""

from __future__ import annotations

from openengine_gateway.spi import BackendSettings
from pydantic import Field


class EchoSettings(BackendSettings):
    """Options of the ``echo`` backend."""

    model: str = "echo"
    repeat: int = Field(default=1, ge=1)
    """How many times the prompt is echoed before the end-of-sequence token."""
    max_context_length: int = Field(default=4096, gt=1)
    token_delay_s: float = Field(default=0.0, ge=0)
    """Time per generated token, to watch streaming, cancellation and load."""


__all__ = ["EchoSettings"]
