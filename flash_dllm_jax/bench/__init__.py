"""Timing helpers shared by scripts/bench_*.py (GPU measurements)."""
