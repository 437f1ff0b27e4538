"""Benchmarks the pallas_kernels ops against their best XLA compositions.

  python scripts/bench_kernels.py results.json            # full sweep (H200)
  python scripts/bench_kernels.py results.json --quick    # reduced sweep
  python scripts/bench_kernels.py /tmp/r.json --smoke     # tiny, CPU interpret
  python scripts/bench_kernels.py r.json --tune --models dream \
      --ops attention --seq-lens 2048 [--list]            # tiling search

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
kernel (attention: block_r, block_k, num_splits, num_warps; matmul: block_m,
block_n, block_e, split_e, num_warps; see flash_dllm_bench/
kernel_bench.py), prints each and writes a "tuning" section: {op: {shape:
{"default", "best", "xla_us", "gain", "all"}}}. --ops picks attention (no mass), attention+mass, cache, matmul;
filters (--models, --batches, --seq-lens, --queries, --ms, --match,
--shapes-limit, --skip-done) restrict the sweep; --list prints the selection
and exits.
The JSON is rewritten after every row: a run cut short keeps its rows.
"""

import argparse
import functools
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flash_dllm_bench import kernel_bench as kt  # noqa: E402
from flash_dllm_bench.kernel_bench import (  # noqa: E402
    copy_bandwidth, max_err, stateless, timeit)
from flash_dllm_bench.timing import matmul_rate  # noqa: E402
from pallas_kernels.attention import api as attn_api  # noqa: E402
from pallas_kernels.attention import kernel as attn_kernel  # noqa: E402
from pallas_kernels.cache_update import api as cache_api  # noqa: E402
from pallas_kernels.cache_update import reference as cache_ref  # noqa: E402
from pallas_kernels.matmul import api as mm_api  # noqa: E402
from pallas_kernels.matmul import kernel as mm_kernel  # noqa: E402

MODELS = {  # H query heads, K kv heads, D head dim, E width, F mlp width
    "llada": dict(h=32, kh=32, d=128, e=4096, f=12288),
    "dream": dict(h=28, kh=4, d=128, e=3584, f=18944),
}
PROJS = ("q_proj", "kv_proj", "gate_up_swiglu", "down+res")
THETA = 10000.0


class Bench:
  """Run settings, the two ceilings and the results (saved as they grow)."""

  def __init__(self, args, impl, reps, inner):
    self.out, self.impl, self.reps, self.inner = args.out, impl, reps, inner
    self.tune_limit = args.tune_limit if args.tune else 0
    self.bw = self.rate = None
    self.rows, self.tuning = [], {}

  def timeit(self, step, state, *args):
    return timeit(step, state, *args, reps=self.reps, inner=self.inner)

  def row(self, op, shape, t_k, t_x, nbytes, flops, err, note=""):
    gbs = nbytes / t_k / 1e9
    r = dict(op=op, shape=shape, kernel_us=t_k * 1e6, xla_us=t_x * 1e6,
             speedup=t_x / t_k, bytes=nbytes, gb_s=gbs,
             frac_copy_bw=gbs * 1e9 / self.bw,
             **kt.roofline(nbytes, flops, t_k, self.bw, self.rate),
             max_err=err, note=note)
    self.rows.append(r)
    print(r, flush=True)
    self.save()

  def tune(self, op, shape, configs, time_cfg, err_fn):
    r = self.rows[-1]
    self.tuning.setdefault(op, {})[shape] = kt.tune(
        f"{op} {shape}", configs, time_cfg, err_fn, r["kernel_us"],
        r["max_err"], r["xla_us"])
    self.save()

  def save(self):
    Path(self.out).write_text(json.dumps(dict(
        jax=jax.__version__, device=jax.devices()[0].device_kind,
        copy_gb_s=self.bw / 1e9, matmul_tflop_s=self.rate / 1e12,
        rows=self.rows, tuning=self.tuning), indent=1))


# ----------------------------------------------------------------- attention
def attention_rows(bench, cfg, sweep, variants):
  impl = bench.impl
  for model, batch, s, q in sweep:
    m = MODELS[model] if model in MODELS else cfg[model]
    h, kh, d = m["h"], m["kh"], m["d"]
    t = min(q, 32)  # verify-pattern in-query keys
    ks = jax.random.split(jax.random.key(batch * 7 + s + q), 8)
    rnd = lambda k, sh: jax.random.normal(k, sh, jnp.bfloat16)
    q_ = rnd(ks[0], (batch, q, h, d))
    # Cache of S + T slots: the XLA baseline scatters the in-query keys into
    # the T spare slots; the kernel reads them from k_new instead.
    kc = rnd(ks[1], (batch, s + t, kh, d))
    vc = rnd(ks[2], (batch, s + t, kh, d))
    kn, vn = rnd(ks[3], (batch, t, kh, d)), rnd(ks[4], (batch, t, kh, d))
    inq = jax.random.bernoulli(ks[5], 0.5, (batch, q, t)).at[:, :, 0].set(True)
    excl = jax.random.bernoulli(ks[6], 0.05, (batch, s + t))
    excl = excl.at[:, s:].set(False)
    score = jnp.ones((batch, q), bool)
    k_len = jnp.full((batch,), s, jnp.int32)
    q_len = jnp.full((batch,), q, jnp.int32)
    scale = d ** -0.5
    kw = dict(scale=scale, k_new_BxTxKxD=kn, v_new_BxTxKxD=vn,
              inq_mask_BxQxT=inq, exclude_BxS=excl)

    def kern(with_mass, fn=attn_api.scheduled_attention, **tiling):
      f = functools.partial(fn, **kw, **tiling)
      return stateless(lambda *a: f(
          *a, score_rows_BxQ=score if with_mass else None))

    slots = jnp.broadcast_to(s + jnp.arange(t), (batch, t))
    key_ok = (jnp.arange(s + t)[None, :] < s) & ~excl
    mask_BxQxN = jnp.concatenate(
        [jnp.broadcast_to(key_ok[:, None, :s], (batch, q, s)), inq], axis=2)

    def xla(with_mass, sdpa_impl):
      def f(state, q_):
        kc, vc = state
        bi = jnp.arange(batch)[:, None]
        kc, vc = kc.at[bi, slots].set(kn), vc.at[bi, slots].set(vn)
        o = jax.nn.dot_product_attention(
            q_, kc, vc, mask=mask_BxQxN[:, None], scale=scale,
            implementation=sdpa_impl)
        if not with_mass:
          return (kc, vc), (o, None)
        g = h // kh
        s_ = jnp.einsum("bqkgd,bnkd->bkgqn", q_.reshape(batch, q, kh, g, d),
                        kc, preferred_element_type=jnp.float32) * scale
        p = jax.nn.softmax(jnp.where(mask_BxQxN[:, None, None], s_, -1e30), -1)
        return (kc, vc), (o, jnp.sum(p[..., :s + t], axis=(1, 2, 3)))
      return jax.jit(f, donate_argnums=0)

    itm = 2
    base_bytes = (2 * batch * s * kh * d + 2 * batch * t * kh * d
                  + 2 * batch * q * h * d) * itm
    shape = f"{model} B={batch} S={s} Q={q} T={t}"
    for op in variants:
      with_mass = op == "attention+mass"
      t_k, out_k = bench.timeit(kern(with_mass, implementation=impl), None,
                                q_, kc, vc, k_len, q_len)
      best, best_out, best_name = None, None, ""
      for sdpa_impl in (["cudnn", "xla"] if impl == "pallas" else ["xla"]):
        try:
          state = (jnp.array(kc), jnp.array(vc))
          t_x, out_x = bench.timeit(xla(with_mass, sdpa_impl), state, q_)
        except Exception as e:  # cudnn may refuse a mask/GQA layout
          print(f"  {sdpa_impl} failed: {type(e).__name__}: {e}"[:200])
          continue
        if best is None or t_x < best:
          best, best_out, best_name = t_x, out_x, sdpa_impl

      def err_fn(out_k, ref=best_out, with_mass=with_mass):
        err = max_err(out_k[0], ref[0])
        if with_mass:  # mass error relative to the largest mass
          m_x = ref[1][:, :s]
          err = max(err, max_err(out_k[1][:, :s], m_x) / float(jnp.max(m_x)))
        return err

      nbytes = base_bytes + (batch * (s + t) * 4 if with_mass else 0)
      flops = kt.attention_flops(batch, q, h, s, t, d, with_mass)
      bench.row(op, shape, t_k, best, nbytes, flops, err_fn(out_k),
                f"xla={best_name}")
      if bench.tune_limit:
        configs = kt.attention_configs(batch, q, h, kh, s, d,
                                       bench.tune_limit, kt.seed_of(shape))
        bench.tune(op, shape, configs, lambda c, wm=with_mass: bench.timeit(
            kern(wm, attn_kernel.scheduled_attention,
                 interpret=impl == "pallas_interpret", **c),
            None, q_, kc, vc, k_len, q_len), err_fn)


# -------------------------------------------------------------- cache update
def cache_rows(bench, cfg, sweep):
  for model, batch, s, q in sweep:
    m = MODELS[model] if model in MODELS else cfg[model]
    h, kh, d = m["h"], m["kh"], m["d"]
    ks = jax.random.split(jax.random.key(batch + s + q), 5)
    rnd = lambda k, sh: jax.random.normal(k, sh, jnp.bfloat16)
    qkv = (rnd(ks[0], (batch, q, h, d)), rnd(ks[1], (batch, q, kh, d)),
           rnd(ks[2], (batch, q, kh, d)))
    pos = jnp.broadcast_to(s // 2 + jnp.arange(q), (batch, q)).astype(jnp.int32)
    caches = (rnd(ks[3], (batch, s, kh, d)), rnd(ks[4], (batch, s, kh, d)))

    def step(fn):
      def f(state, q_, k_, v_):
        qo, kc, vc = fn(q_, k_, v_, pos, pos, *state, theta=THETA,
                        scale=d ** -0.5)
        return (kc, vc), qo
      return jax.jit(f, donate_argnums=0)

    kern = functools.partial(cache_api.rope_write, implementation=bench.impl)
    t_k, o_k = bench.timeit(step(kern), tuple(map(jnp.array, caches)), *qkv)
    t_x, o_x = bench.timeit(step(cache_ref.rope_write),
                            tuple(map(jnp.array, caches)), *qkv)
    nbytes = 2 * batch * q * (2 * h * d + 4 * kh * d)  # q in/out, k/v in/out
    bench.row("rope_cache_write", f"{model} B={batch} S={s} Q={q}", t_k, t_x,
              nbytes, 0, max_err(o_k, o_x))


# -------------------------------------------------------------------- matmul
def mm_dims(cfg, model, name):
  """(E in, N out, SwiGLU) of a projection."""
  m = MODELS[model] if model in MODELS else cfg[model]
  return {"q_proj": (m["e"], m["h"] * m["d"], False),
          "kv_proj": (m["e"], m["kh"] * m["d"], False),
          "gate_up_swiglu": (m["e"], m["f"], True),
          "down+res": (m["f"], m["e"], False)}[name]


def matmul_rows(bench, cfg, sweep):
  for model, name, mm in sweep:
    ein, n, swiglu = mm_dims(cfg, model, name)
    ks = jax.random.split(jax.random.key(mm + n), 4)
    x = jax.random.normal(ks[0], (mm, ein), jnp.bfloat16)
    w = jax.random.normal(ks[1], (ein, n), jnp.bfloat16) * ein ** -0.5
    wu = (jax.random.normal(ks[2], (ein, n), jnp.bfloat16) * ein ** -0.5
          if swiglu else None)
    res = (jax.random.normal(ks[3], (mm, n), jnp.bfloat16)
           if name == "down+res" else None)
    kw = dict(w_up_ExN=wu, residual_MxN=res)
    run = lambda fn, **more: bench.timeit(
        stateless(functools.partial(fn, **kw, **more)), None, x, w)
    t_k, o_k = run(mm_api.matmul, implementation=bench.impl)
    t_x, o_x = run(mm_api.matmul, implementation="reference")
    nbytes = 2 * (ein * n * (2 if swiglu else 1) + mm * ein
                  + mm * n * (2 if res is not None else 1))
    shape = f"{model} {name} M={mm} {ein}x{n}"
    bench.row("matmul", shape, t_k, t_x, nbytes,
              kt.matmul_flops(mm, ein, n, swiglu), max_err(o_k, o_x),
              "M>256: reference" if mm > 256 else "")
    if bench.tune_limit and mm <= 256:  # larger M: the kernel isn't used
      configs = kt.matmul_configs(mm, ein, n, swiglu, bench.tune_limit,
                                  kt.seed_of(shape))
      bench.tune("matmul", shape, configs, lambda c: run(
          mm_kernel.matmul, interpret=bench.impl == "pallas_interpret", **c),
          lambda o: max_err(o, o_x))


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


def main():
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
  args = ap.parse_args()

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
