"""Load time and peak host memory: a Hugging Face directory (streamed by
`load`) against its converted orbax copy, for the tiny test fixtures.

  python scripts/bench_load.py [--layers 2] [--repeats 3]

Each load runs in a fresh process (JAX already imported); memory: the
growth of the process's peak RSS across the `load` call, and the peak of
Python and numpy allocations during it (tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_MEASURE = r"""
import json, resource, sys, time, tracemalloc
import jax, jax.numpy as jnp
jnp.zeros(1).block_until_ready()
from flash_dllm_jax import load
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
t0 = time.perf_counter()
params, config, _ = load(sys.argv[1])
jax.block_until_ready(params)
seconds = time.perf_counter() - t0
traced = tracemalloc.get_traced_memory()[1]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
print(json.dumps({"seconds": seconds, "peak_growth_mib": (after - before) / 1024,
                  "traced_peak_mib": traced / 2**20,
                  "param_mib": n / 2**20}))
"""


def _measure(path: Path) -> dict:
  out = subprocess.run([sys.executable, "-c", _MEASURE, str(path)],
                       capture_output=True, text=True, check=True, cwd=ROOT)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  from flash_dllm_jax.convert import convert_checkpoint
  from tests import hf_fixtures
  with tempfile.TemporaryDirectory() as tmp:
    for arch, write in (("llada", hf_fixtures.write_llada),
                        ("dream", hf_fixtures.write_dream)):
      src, _ = write(Path(tmp) / arch, n_layers=args.layers)
      dst = Path(tmp) / f"{arch}-converted"
      convert_checkpoint(src, dst, progress=False)
      for kind, path in (("hf", src), ("converted", dst)):
        runs = [_measure(path) for _ in range(args.repeats)]
        best = min(r["seconds"] for r in runs)
        peak = max(r["peak_growth_mib"] for r in runs)
        traced = max(r["traced_peak_mib"] for r in runs)
        print(f"{arch:6s} {kind:9s} params {runs[0]['param_mib']:.2f} MiB  "
              f"load {best:.3f} s (best of {args.repeats})  "
              f"peak RSS growth {peak:.1f} MiB  "
              f"peak Python/numpy allocations {traced:.2f} MiB")


if __name__ == "__main__":
  main()
