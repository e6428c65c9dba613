"""Benchmarks run by hand (``python -m bench``); results and commands in docs/benchmarks.md."""
