"""Benchmark helpers of scripts/bench_*.py: device timing, ceilings, kernel
sweeps and trace summaries (imports the inference package, never the reverse)."""
