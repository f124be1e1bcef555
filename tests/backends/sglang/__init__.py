"""Tests of the SGLang driver: mapping without SGLang, engine level on a faithful fake of it."""
