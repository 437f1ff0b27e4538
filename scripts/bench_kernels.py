"""Benchmarks the pallas_kernels ops against their best XLA compositions.

  python scripts/bench_kernels.py results.json            # full sweep (H200)
  python scripts/bench_kernels.py results.json --quick    # reduced sweep
  python scripts/bench_kernels.py /tmp/r.json --smoke     # tiny, CPU interpret

(Not under pytest, so tests/conftest.py's JAX_PLATFORMS=cpu default doesn't
apply.) One --quick run on an H200 (jax 0.11.2) took ~2 min.

For each op and shape: median time (block_until_ready over many reps), bytes
the op must move at least, achieved GB/s, that as a fraction of an elementwise
device copy measured in the same run, the XLA baseline's time, the ratio
baseline / kernel (> 1: kernel faster) and the max |kernel - baseline|.
Prints a markdown table per op and writes every row to the JSON path.
"""

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pallas_kernels.attention import api as attn_api  # noqa: E402
from pallas_kernels.cache_update import api as cache_api  # noqa: E402
from pallas_kernels.cache_update import reference as cache_ref  # noqa: E402
from pallas_kernels.matmul import api as mm_api  # noqa: E402

MODELS = {  # H query heads, K kv heads, D head dim, E width, F mlp width
    "llada": dict(h=32, kh=32, d=128, e=4096, f=12288),
    "dream": dict(h=28, kh=4, d=128, e=3584, f=18944),
}
THETA = 10000.0


def timeit(step, state, *args, reps, inner):
  """Median seconds of one `state, out = step(state, *args)`.

  `inner` steps run inside one jitted fori_loop (host dispatch amortised);
  an optimization_barrier ties each step's inputs to the previous output so
  XLA can't hoist the loop-invariant call. Returns (seconds, last output).
  """
  out_shape = jax.eval_shape(step, state, *args)[1]

  def many(state, args):
    out = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out_shape)

    def body(_, carry):
      state, args, out = lax.optimization_barrier(carry)
      state, out = step(state, *args)
      return state, args, out

    state, _, out = lax.fori_loop(0, inner, body, (state, args, out))
    return state, out

  many = jax.jit(many, donate_argnums=0)
  state, out = jax.block_until_ready(many(state, args))  # compile + warm up
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    state, out = jax.block_until_ready(many(state, args))
    times.append((time.perf_counter() - t0) / inner)
  return statistics.median(times), out


def stateless(f):
  return jax.jit(lambda state, *a: (state, f(*a)))


def copy_bandwidth(nbytes, reps, inner):
  """Bytes/s of x + 1 over a bf16 buffer (reads and writes nbytes each)."""
  x = jnp.zeros((nbytes // 2,), jnp.bfloat16)
  t, _ = timeit(lambda x: (x + 1, None), x, reps=reps, inner=inner)
  return 2 * nbytes / t


def max_err(a, b):
  leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
  return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(
      jnp.float32)))) for x, y in leaves)


def row(op, shape, t_k, t_x, nbytes, bw, err, note=""):
  gbs = nbytes / t_k / 1e9
  return dict(op=op, shape=shape, kernel_us=t_k * 1e6, xla_us=t_x * 1e6,
              speedup=t_x / t_k, bytes=nbytes, gb_s=gbs,
              frac_copy_bw=gbs * 1e9 / bw, max_err=err, note=note)


# ----------------------------------------------------------------- attention
def attention_rows(cfg, impl, bw, reps, inner, sweep):
  rows = []
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

    def kern(with_mass):
      f = functools.partial(attn_api.scheduled_attention, **kw,
                            implementation=impl)
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
    for with_mass in (False, True):
      t_k, out_k = timeit(kern(with_mass), None, q_, kc, vc, k_len, q_len,
                          reps=reps, inner=inner)
      best, best_out, best_name = None, None, ""
      for sdpa_impl in (["cudnn", "xla"] if impl == "pallas" else ["xla"]):
        try:
          state = (jnp.array(kc), jnp.array(vc))
          t_x, out_x = timeit(xla(with_mass, sdpa_impl), state, q_,
                              reps=reps, inner=inner)
        except Exception as e:  # cudnn may refuse a mask/GQA layout
          print(f"  {sdpa_impl} failed: {type(e).__name__}: {e}"[:200])
          continue
        if best is None or t_x < best:
          best, best_out, best_name = t_x, out_x, sdpa_impl
      o_x = best_out[0]
      err = max_err(out_k[0], o_x)
      if with_mass:  # mass error relative to the largest mass
        m_x = best_out[1][:, :s]
        err = max(err, max_err(out_k[1][:, :s], m_x) / float(jnp.max(m_x)))
      nbytes = base_bytes + (batch * (s + t) * 4 if with_mass else 0)
      rows.append(row("attention+mass" if with_mass else "attention",
                      f"{model} B={batch} S={s} Q={q} T={t}", t_k, best,
                      nbytes, bw, err, f"xla={best_name}"))
      print(rows[-1], flush=True)
  return rows


# -------------------------------------------------------------- cache update
def cache_rows(cfg, impl, bw, reps, inner, sweep):
  rows = []
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

    kern = functools.partial(cache_api.rope_write, implementation=impl)
    t_k, o_k = timeit(step(kern), tuple(map(jnp.array, caches)), *qkv,
                      reps=reps, inner=inner)
    t_x, o_x = timeit(step(cache_ref.rope_write),
                      tuple(map(jnp.array, caches)), *qkv, reps=reps,
                      inner=inner)
    nbytes = 2 * batch * q * (2 * h * d + 4 * kh * d)  # q in/out, k/v in/out
    rows.append(row("rope_cache_write", f"{model} B={batch} S={s} Q={q}",
                    t_k, t_x, nbytes, bw, max_err(o_k, o_x)))
    print(rows[-1], flush=True)
  return rows


# -------------------------------------------------------------------- matmul
def matmul_rows(cfg, impl, bw, reps, inner, sweep):
  rows = []
  for model, name, mm in sweep:
    m_ = MODELS[model] if model in MODELS else cfg[model]
    e, f, h, kh, d = m_["e"], m_["f"], m_["h"], m_["kh"], m_["d"]
    shapes = {"q_proj": (e, h * d, False), "kv_proj": (e, kh * d, False),
              "gate_up_swiglu": (e, f, True), "down+res": (f, e, False)}
    ein, n, swiglu = shapes[name]
    ks = jax.random.split(jax.random.key(mm + n), 4)
    x = jax.random.normal(ks[0], (mm, ein), jnp.bfloat16)
    w = jax.random.normal(ks[1], (ein, n), jnp.bfloat16) * ein ** -0.5
    wu = (jax.random.normal(ks[2], (ein, n), jnp.bfloat16) * ein ** -0.5
          if swiglu else None)
    res = (jax.random.normal(ks[3], (mm, n), jnp.bfloat16)
           if name == "down+res" else None)
    kw = dict(w_up_ExN=wu, residual_MxN=res)
    t_k, o_k = timeit(stateless(functools.partial(
        mm_api.matmul, **kw, implementation=impl)), None, x, w,
        reps=reps, inner=inner)
    t_x, o_x = timeit(stateless(functools.partial(
        mm_api.matmul, **kw, implementation="reference")), None, x, w,
        reps=reps, inner=inner)
    nbytes = 2 * (ein * n * (2 if swiglu else 1) + mm * ein
                  + mm * n * (2 if res is not None else 1))
    rows.append(row("matmul", f"{model} {name} M={mm} {ein}x{n}", t_k, t_x,
                    nbytes, bw, max_err(o_k, o_x),
                    "M>256: reference" if mm > 256 else ""))
    print(rows[-1], flush=True)
  return rows


def table(rows):
  cols = ["op", "shape", "kernel_us", "xla_us", "speedup", "gb_s",
          "frac_copy_bw", "max_err", "note"]
  out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in rows:
    out.append("| " + " | ".join(
        f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
        for c in cols) + " |")
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("out", help="results JSON path")
  ap.add_argument("--quick", action="store_true", help="reduced sweep")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny shapes, interpret mode: runs on CPU")
  ap.add_argument("--ops", default="attention,cache,matmul")
  ap.add_argument("--reps", type=int, default=None)
  ap.add_argument("--inner", type=int, default=None,
                  help="op calls per timed repetition (one jitted loop)")
  args = ap.parse_args()

  cfg = {}
  if args.smoke:
    cfg["tiny"] = dict(h=4, kh=2, d=64, e=128, f=256)
    cfg["tiny_g7"] = dict(h=7, kh=1, d=64, e=128, f=192)
    impl, reps, inner, copy_mb = "pallas_interpret", 2, 1, 8
    attn = [(mo, 2, 64, 8) for mo in cfg]
    cache = [(mo, 2, 64, 8) for mo in cfg]
    mm = [("tiny", n, m) for n in ("q_proj", "gate_up_swiglu", "down+res")
          for m in (1, 20)] + [("tiny_g7", "kv_proj", 300)]
  else:
    impl, reps, inner, copy_mb = "pallas", 10, 50, 2048
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
    mm = [(mo, n, m) for mo in MODELS
          for n in ("q_proj", "kv_proj", "gate_up_swiglu", "down+res")
          for m in ms]
  reps, inner = args.reps or reps, args.inner or inner
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; impl={impl}")
  bw = copy_bandwidth(copy_mb << 20, reps, inner)
  print(f"elementwise copy bandwidth: {bw / 1e9:.1f} GB/s", flush=True)
  rows = []
  ops = args.ops.split(",")
  if "attention" in ops:
    rows += attention_rows(cfg, impl, bw, reps, inner, attn)
  if "cache" in ops:
    rows += cache_rows(cfg, impl, bw, reps, inner, cache)
  if "matmul" in ops:
    rows += matmul_rows(cfg, impl, bw, reps, inner, mm)
  print(table(rows))
  Path(args.out).write_text(json.dumps(dict(
      jax=jax.__version__, device=jax.devices()[0].device_kind,
      copy_gb_s=bw / 1e9, rows=rows), indent=1))


if __name__ == "__main__":
  main()
