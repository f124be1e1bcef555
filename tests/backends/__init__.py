"""Tests of the built-in backend drivers."""
