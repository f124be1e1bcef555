"""The vLLM driver against a real vLLM engine (CPU build in CI)."""
