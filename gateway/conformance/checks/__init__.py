"""Every conformance check, by contract area; importing this package registers them."""

from . import discovery, generation  # noqa: F401
