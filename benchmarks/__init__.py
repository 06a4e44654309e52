"""Benchmarks: commands that print figures (run from the repository root)."""
