"""The TensorRT-LLM releases the driver was written against, checked at start: pure.

The driver reads TensorRT-LLM's behaviour off its sources, release by release (the table in
docs/backends/trtllm.md says which text each behaviour was read from). Two lines are served:
1.2.1 (the 1.2 line's last release) and 1.3 from 1.3.0rc29 (the release candidate NVIDIA Dynamo
1.6.1 pins, the newest 1.3 on the package index when this was written). Earlier 1.3 candidates
changed the LLM API between them and were not read, so they are refused like any other release,
naming the version, before a model loads. What differs between the two lines is read off the
installed classes at start (``generate_async``'s parameters, ``DisaggregatedParams``'s fields),
not off the version.
"""

from __future__ import annotations

import re

from openengine_gateway.spi import ConfigurationError

SUPPORTED = "1.2.1 or later 1.2 releases, and 1.3 from 1.3.0rc29"
"""The releases the driver serves, in words (the ``trtllm`` extra names the same range)."""

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?")
_FINAL = 1 << 30
"""Sorts a final release after each of its release candidates."""


def _release(version: str) -> tuple[int, int, int, int]:
    """``(major, minor, patch, rc)`` of a TensorRT-LLM version; a final release has the largest rc."""
    match = _VERSION.match(version)
    if match is None:
        raise ConfigurationError(f"trtllm: cannot read TensorRT-LLM's version {version!r}; it serves {SUPPORTED}")
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch), _FINAL if rc is None else int(rc)


def check_version(version: str) -> None:
    """``ConfigurationError`` naming ``version`` unless the driver serves it."""
    found = _release(version)
    if (1, 2, 1, _FINAL) <= found < (1, 3, 0, 0) or (1, 3, 0, 29) <= found < (1, 4, 0, 0):
        return
    raise ConfigurationError(
        f"trtllm: TensorRT-LLM {version} is not served; the driver serves {SUPPORTED} "
        "(pip install 'openengine-gateway[trtllm]')"
    )


__all__ = ["SUPPORTED", "check_version"]
