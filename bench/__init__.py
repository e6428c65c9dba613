"""Benchmarks run by hand (``batchserve bench``); results and commands in docs/benchmarks.md."""
