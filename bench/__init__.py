"""Benchmarks, one module each (``python -m bench.NAME``; docs/benchmarks.md lists them and what they measured),
each writing JSON under ``bench/results/``; what they share is in `bench.lib`."""
