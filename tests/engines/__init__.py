"""Tests that run real inference engines, marked by engine."""
