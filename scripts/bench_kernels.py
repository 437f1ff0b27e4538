"""Benchmarks the pallas_kernels ops against their best XLA compositions.

  python scripts/bench_kernels.py results.json            # full sweep (H200)
  python scripts/bench_kernels.py results.json --quick    # reduced sweep
  python scripts/bench_kernels.py /tmp/r.json --smoke     # tiny, CPU interpret
  python scripts/bench_kernels.py r.json --tune --models dream \
      --ops attention --seq-lens 2048 [--list]            # tiling search
  python scripts/bench_kernels.py q.json --qmatmul [--markdown q.md]
                                           # 8-bit weights vs bf16 (H200)

(Not under pytest, so tests/conftest.py's JAX_PLATFORMS=cpu default doesn't
apply.)

For each op and shape: median time (block_until_ready over many reps), bytes
the op must move at least, achieved GB/s, that as a fraction of an elementwise
device copy measured in the same run, the XLA baseline's time, the ratio
baseline / kernel (> 1: kernel faster) and the max |kernel - baseline|.
Roofline columns: FLOPs (attention 4·B·Q·H·(S+T)·D for QK and PV, plus
2·B·Q·H·S·D when the mass pass recomputes QK; matmul 2·M·E·N, twice for
SwiGLU; cache write 0), roofline_us = max(bytes / copy rate, FLOPs / bf16
matmul rate measured in the same run), frac_roofline = roofline_us /
kernel_us and bound ("mem"/"flop"). The copy rate is an elementwise read +
write; read-dominated kernels can beat it (BENCHMARKS.md, "Kernels"), so
frac_copy_bw and frac_roofline above 1 are possible and not a bug.

--tune: for each shape also times up to --tune-limit tilings of the Pallas
kernel (attention: block_r, block_k, split_tiles, num_warps; matmul: block_m,
block_n, block_e, split_e, num_warps; see flash_dllm_bench/
kernel_bench.py), prints each and writes a "tuning" section: {op: {shape:
{"default", "best", "xla_us", "gain", "all"}}}. --ops picks attention (no mass), attention+mass, cache, matmul;
filters (--models, --batches, --seq-lens, --queries, --ms, --match,
--shapes-limit, --skip-done) restrict the sweep; --list prints the selection
and exits.
The JSON is rewritten after every row: a run cut short keeps its rows.

--qmatmul: instead, the 8-bit-weight matmul table at LLaDA-8B's projection
shapes (flash_dllm_bench/qmatmul_bench.py): bf16 XLA dot, the
weight-streaming kernel in int8 / fp8 (a few tilings; --tune --tune-limit N
for more) and XLA's W8A8 and int8 dots, against the copy, bf16 and fp8
matmul rates of the same run; --ms, --match, --reps, --inner, --smoke apply.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flash_dllm_bench import kernel_bench as kt  # noqa: E402
from flash_dllm_bench.kernel_bench import copy_bandwidth  # noqa: E402
from flash_dllm_bench.kernel_rows import (  # noqa: E402
    MODELS, PROJS, Bench, attention_rows, cache_rows, matmul_rows, mm_dims)
from flash_dllm_bench.timing import matmul_rate  # noqa: E402


def table(rows):
  cols = ["op", "shape", "kernel_us", "xla_us", "speedup", "gb_s",
          "frac_copy_bw", "roofline_us", "frac_roofline", "bound", "max_err",
          "note"]
  out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in rows:
    out.append("| " + " | ".join(
        f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
        for c in cols) + " |")
  return "\n".join(out)


def select(sweep, args, label, limit):
  """Sweep entries passing --match (on `label(entry)`), first `limit`."""
  keep = [e for e in sweep if not args.match or re.search(args.match,
                                                          label(e))]
  return keep[:limit] if limit else keep


def measured(paths) -> set[tuple[str, str]]:
  """(op, shape) of every row in earlier results files."""
  return {(r["op"], r["shape"]) for p in paths
          for r in json.loads(Path(p).read_text())["rows"]}


def main(argv=None):
  ints = lambda s: [int(v) for v in s.split(",")]
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("out", help="results JSON path")
  ap.add_argument("--quick", action="store_true", help="reduced sweep")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny shapes, interpret mode: runs on CPU")
  ap.add_argument("--ops", default="attention,attention+mass,cache,matmul",
                  help="attention is the no-mass variant")
  ap.add_argument("--reps", type=int, default=None)
  ap.add_argument("--inner", type=int, default=None,
                  help="op calls per timed repetition (one jitted loop)")
  ap.add_argument("--tune", action="store_true",
                  help="also time tilings of each shape's Pallas kernel")
  ap.add_argument("--tune-limit", type=int, default=16,
                  help="configs per shape, the default included")
  ap.add_argument("--models", default=None, help="e.g. llada,dream")
  ap.add_argument("--batches", type=ints, default=None, help="e.g. 1,32")
  ap.add_argument("--seq-lens", type=ints, default=None, help="cache S")
  ap.add_argument("--queries", type=ints, default=None, help="query Q")
  ap.add_argument("--ms", type=ints, default=None, help="matmul M")
  ap.add_argument("--match", default=None,
                  help="regex on 'op shape' (op: attention, cache, matmul), "
                       "e.g. '^attention dream .*Q=16|M=128 '")
  ap.add_argument("--shapes-limit", type=int, default=None,
                  help="first N shapes per op after filtering")
  ap.add_argument("--skip-done", nargs="+", type=Path, default=None,
                  metavar="JSON", help="skip shapes these earlier results "
                  "already hold (every requested variant of them)")
  ap.add_argument("--list", action="store_true",
                  help="print the selected shapes and configs, run nothing")
  ap.add_argument("--qmatmul", action="store_true",
                  help="the 8-bit-weight matmul table instead of --ops")
  ap.add_argument("--markdown", default=None,
                  help="--qmatmul's markdown table (default OUT with .md)")
  args = ap.parse_args(argv)
  if args.qmatmul:
    from flash_dllm_bench import qmatmul_bench
    qmatmul_bench.run(args)
    return

  cfg = {}
  if args.smoke:
    cfg["tiny"] = dict(h=4, kh=2, d=64, e=128, f=256)
    cfg["tiny_g7"] = dict(h=7, kh=1, d=64, e=128, f=192)
    impl, reps, inner, copy_mb, mm_n = "pallas_interpret", 2, 1, 8, 256
    attn = [(mo, 2, 64, 8) for mo in cfg]
    cache = [(mo, 2, 64, 8) for mo in cfg]
    mm = [("tiny", n, m) for n in ("q_proj", "gate_up_swiglu", "down+res")
          for m in (1, 20)] + [("tiny_g7", "kv_proj", 300)]
  else:
    impl, reps, inner, copy_mb, mm_n = "pallas", 10, 50, 2048, 8192
    bs, ss, qs = (([1, 32], [2048], [32]) if args.quick
                  else ([1, 8, 32], [1024, 2048, 4096], [16, 128, 32]))
    # Models innermost and the query counts outermost: a run cut short
    # (each row is printed as it is measured) still covers both models,
    # every batch and cache length.
    attn = [(mo, b, s, q) for q in qs for s in ss for b in bs
            for mo in MODELS]
    # The cache write's cost does not depend on the cache length.
    cache = [(mo, b, 2048, q) for q in qs for b in bs for mo in MODELS]
    ms = [1, 32, 160] if args.quick else [1, 16, 32, 128, 160, 512]
    mm = [(mo, n, m) for mo in MODELS for n in PROJS for m in ms]
  want = lambda vals, v: vals is None or v in vals
  models = args.models and args.models.split(",")
  attn, cache = ([e for e in sw if want(models, e[0]) and want(
      args.batches, e[1]) and want(args.seq_lens, e[2]) and want(
          args.queries, e[3])] for sw in (attn, cache))
  mm = [e for e in mm if want(models, e[0]) and want(args.ms, e[2])]
  ops = args.ops.split(",")
  labels = dict(
      attention=lambda e: "attention {} B={} S={} Q={} T={}".format(
          *e, min(e[3], 32)),
      cache=lambda e: "cache {} B={} S={} Q={}".format(*e),
      matmul=lambda e: "matmul {} {} M={} {}x{}".format(
          *e, *mm_dims(cfg, e[0], e[1])[:2]))
  attn, cache, mm = (select(sw, args, labels[k], args.shapes_limit)
                     for sw, k in ((attn, "attention"), (cache, "cache"),
                                   (mm, "matmul")))
  variants = [o for o in ("attention", "attention+mass") if o in ops]
  if args.skip_done:
    done = measured(args.skip_done)
    row_ops = dict(attention=variants, cache=["rope_cache_write"],
                   matmul=["matmul"])
    attn, cache, mm = ([e for e in sw if not all(
        (op, labels[k](e).split(" ", 1)[1]) in done for op in row_ops[k])]
                       for sw, k in ((attn, "attention"), (cache, "cache"),
                                     (mm, "matmul")))
  todo = dict(attention=attn if variants else [],
              cache=cache if "cache" in ops else [],
              matmul=mm if "matmul" in ops else [])
  if args.list:  # what a run would time, and how many tune configs
    n_cfg = args.tune_limit if args.tune else 1
    for k, sw in todo.items():
      for e in sw:
        tuned = k == "attention" or (k == "matmul" and e[2] <= 256)
        print(labels[k](e), f"x{max(1, len(variants) * (k == 'attention'))}",
              f"({n_cfg if tuned else 1} configs)")
    return

  bench = Bench(args, impl, args.reps or reps, args.inner or inner)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; impl={impl}")
  bench.bw = copy_bandwidth(copy_mb << 20, bench.reps, bench.inner)
  bench.rate = matmul_rate(mm_n, reps=bench.reps)
  print(f"elementwise copy bandwidth: {bench.bw / 1e9:.1f} GB/s; bf16 matmul"
        f" {bench.rate / 1e12:.1f} TFLOP/s", flush=True)
  attention_rows(bench, cfg, todo["attention"], variants)
  cache_rows(bench, cfg, todo["cache"])
  matmul_rows(bench, cfg, todo["matmul"])
  print(table(bench.rows))
  if bench.tuning:
    print(kt.tuning_table(bench.tuning))
  bench.save()


if __name__ == "__main__":
  main()
