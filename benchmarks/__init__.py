"""Overhead benchmarks: programs that print ratios, run one at a time (``make bench``), never under pytest."""
