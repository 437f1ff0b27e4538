"""The rows of scripts/bench_kernels.py: each Pallas kernel against its best
XLA composition, shape by shape, with the optional tiling search (the
shapes, the two ceilings and the results file live in `Bench`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp

from flash_dllm_bench import kernel_bench as kt
from flash_dllm_bench.kernel_bench import max_err, stateless, timeit
from pallas_kernels.attention import api as attn_api
from pallas_kernels.attention import kernel as attn_kernel
from pallas_kernels.cache_update import api as cache_api
from pallas_kernels.cache_update import reference as cache_ref
from pallas_kernels.matmul import api as mm_api
from pallas_kernels.matmul import kernel as mm_kernel

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
    kw = dict(scale=scale, k_new_BxIxKxD=kn, v_new_BxIxKxD=vn,
              inq_mask_BxQxI=inq, exclude_BxS=excl)

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
    kw = dict(w_up_ExO=wu, residual_MxO=res)
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
