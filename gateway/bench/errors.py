"""Benchmark errors: each stops the run before or after measuring, with a message for the user."""

from __future__ import annotations


class BenchError(Exception):
    """Base of the benchmark's own errors (the command prints them and exits with status 2)."""


class WorkloadError(BenchError, ValueError):
    """A workload setting or prompts file that cannot be used."""


class ReportError(BenchError):
    """The report cannot be written (matplotlib is missing)."""


__all__ = ["BenchError", "ReportError", "WorkloadError"]
