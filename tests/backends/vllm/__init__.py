"""Mapping tests of the vLLM driver: no vLLM needed."""
