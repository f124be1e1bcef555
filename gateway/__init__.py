"""openengine-gateway: the OpenEngine v1 contract in front of real inference engines."""

__version__ = "0.2.0"
