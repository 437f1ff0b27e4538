"""Where does a row's decode start to depend on the other rows of its batch?

GPU (H200, < 3 min; XLA flags via XLA_FLAGS): batch 128 vs its first 64 rows,
or vs the same 128 rows data-parallel (--sub 128 --sub-mesh data=2, 2 GPUs):
  python scripts/probe_row_invariance.py --xla-note default --json out/p.json
CPU, no difference since the YNNPACK fix (36d84ee), then the piece report on
a real difference (YNNPACK fusions back on, >= ~4096 rows x positions):
  python scripts/probe_row_invariance.py --batch 16 --sub 8 --gen-length 64
  python scripts/probe_row_invariance.py --batch 64 --sub 8 --gen-length 64 --cpu-ynnpack

Rows: the first --batch problems (file order) of data/synthetic_gsm/test.jsonl
in its largest prompt-length bucket, chat template and seeds as in the eval.
Batch A: all; batch B: the first --sub. Both run generate.decode_tokens's
loop (run_compiled) with a traced step limit, compiled as decode_jit is (on
CPU with CPU_COMPILER_OPTIONS unless --cpu-ynnpack).
1. Per checked step k (--steps, and the last): the DecodeState leaves that
   differ bitwise (bf16 as uint16) on the shared rows, with element counts
   (per-layer leaves summed as [*]; the JSON has each). After one loop has
   stopped the other still updates finished rows' aux, so only tokens, done,
   forwards and steps are compared then. Bisection finds a step s that
   differs while the state at s - 1 agrees.
2. From both states at s - 1, one compiled program per batch runs step s of
   a Flash-Cache sampler (its own selection and _prefill/_flash forward) and
   records in order: query slots, embedding; per layer (module names)
   attn_norm, q/k/v_proj, rope+cache write (q, k/v cache), attention kernel
   out and mass, attn_out (o proj), residual, mlp_norm, gate_proj, up_proj,
   silu(gate)*up, down_proj, block out; final norm, logits, summed mass,
   confidence, and the real step (step_trace: tokens, aux, verify plan and
   probabilities). It prints the first differing piece. (--strategy takes
   any strategy; part 2 only the Flash-Cache ones.)
   Library code is unchanged: a Flax method interceptor sees module inputs
   and outputs; ops.rope_and_write / cached_attention are wrapped while
   tracing. Not reachable so: the verify pass's layers (inside lax.cond;
   only its outputs are compared) and the insides of the kernels. Recorded
   intermediates are program outputs, which can change XLA's fusions: the
   report says when the recorded program lost the difference.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from flash_dllm_jax import ops, parallel  # noqa: E402
from flash_dllm_jax.generate import (bucket_groups,  # noqa: E402
                                     compiler_options, left_pad)
from flash_dllm_jax.model.layers import Linear, RMSNorm  # noqa: E402
from flash_dllm_jax.model.transformer import Block, Transformer  # noqa: E402
from flash_dllm_jax.sampling import (DecodeState, flash_budget,  # noqa: E402
                                     make_step, parallel_rules, run_compiled)
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler  # noqa: E402
from flash_dllm_jax.sampling.sequence_model import SequenceModel  # noqa: E402

INPUTS = {"mlp_norm": "residual (x + attn_out)", "down_proj": "silu(gate) * up"}
FROZEN = (".tokens_BxN", ".done_B", ".forwards_B", ".steps_B")


def bucket_rows(tokenizer, config, data_dir, batch, limit=None, with_index=None):
  """(ids, valid, seeds) of the first `batch` problems of the largest bucket
  of the first `limit` problems (the eval's --limit), or of the bucket that
  holds problem `with_index` (its record id's number)."""
  from flash_dllm_jax.eval.tasks import make_render
  from flash_dllm_jax.eval.tasks.gsm8k import GSM8K
  probs = GSM8K(data_dir, num_fewshot=0, chat=True).problems(
      make_render(tokenizer, True))
  probs = probs[:limit]
  rows = [tokenizer.encode(p.prompt) for p in probs]
  groups = bucket_groups(rows)
  if with_index is None:
    group = max(groups, key=len)[:batch]
  else:
    group = [g for g in groups
             if with_index in [probs[i].index for i in g]]
    if not group:
      raise ValueError(f"problem {with_index} is not among the first "
                       f"{len(probs)} problems")
    group = group[0][:batch]
  ids, valid = left_pad([rows[i] for i in group], config.pad_token_id)
  return ids, valid, np.array([probs[i].index for i in group])


def _model(params, config, valid_BxP, gen_length):
  valid_BxN = jnp.concatenate(
      [valid_BxP, jnp.ones((valid_BxP.shape[0], gen_length), bool)], axis=1)
  return SequenceModel.for_batch(config, params, valid_BxN, None,
                                 stop_ids=config.stop_token_ids)


def decode_state(params, ids, valid, rng_B, max_steps, *, config, sampler):
  """generate.decode_tokens, returning the DecodeState after max_steps."""
  m = _model(params, config, valid, sampler.gen_length)
  state = DecodeState.start(ids, sampler.gen_length, config.mask_token_id,
                            rng_B)
  state = state.replace(aux=sampler.init_aux(m, state.tokens_BxN))
  return run_compiled(make_step(sampler, m, ids.shape[1], m.stop_ids), state,
                      jnp.minimum(max_steps, sampler.num_steps))


@contextlib.contextmanager
def recording(rec):
  """Appends (name, array) for the module calls and cached-path ops traced
  inside (the library's own code, observed, not re-implemented)."""
  real, at = (ops.rope_and_write, ops.cached_attention), {"L": ""}

  def rope_and_write(*args, **kwargs):
    out = real[0](*args, **kwargs)
    rec.extend((f"{at['L']} rope+cache write: {name}", x)
               for name, x in zip(("q", "k cache", "v cache"), out))
    return out

  def cached_attention(*args, **kwargs):
    o, mass = real[1](*args, **kwargs)
    rec.append((f"{at['L']} attention (kernel) out", o))
    if mass is not None:
      rec.append((f"{at['L']} attention mass", mass))
    return o, mass

  def intercept(next_fun, args, kwargs, ctx):
    mod, name = ctx.module, ctx.module.name
    if ctx.method_name != "__call__":
      return next_fun(*args, **kwargs)
    if isinstance(mod, Block):
      at["L"] = "L" + name.split("_")[-1]
      if name == "layers_0":
        rec.append(("embedding", args[0]))
    if name in INPUTS:
      rec.append((f"{at['L']} {INPUTS[name]}", args[0]))
    out = next_fun(*args, **kwargs)
    if name == "final_norm" or isinstance(mod, Transformer):
      rec.append(("final norm", out) if name == "final_norm" else
                 ("logits", out[0]))
    elif isinstance(mod, (Linear, RMSNorm, Block)):
      rec.append((f"{at['L']} {name if name[0] != 'l' else 'block out'}",
                  out[0] if isinstance(mod, Block) else out))
    return out

  ops.rope_and_write, ops.cached_attention = rope_and_write, cached_attention
  try:
    with nn.intercept_methods(intercept):
      yield
  finally:
    ops.rope_and_write, ops.cached_attention = real


def probe_step(params, ids, valid, state, *, config, sampler, prefill):
  """Step state.step + 1 of a Flash-Cache sampler with its pieces recorded
  ({'NNNN name': array}, NNNN = execution order)."""
  m = _model(params, config, valid, sampler.gen_length)
  tokens, aux, p = state.tokens_BxN, state.aux, ids.shape[1]
  w, x = sampler.block_m, sampler.extra_masks
  slots = sampler._select(aux, *flash_budget.candidates(m, tokens, p))
  scored = slots[:, :w + x]  # as in FlashDLLMSampler.step_trace
  pred = jnp.where(scored >= 0, scored - config.logits_shift, -1)
  window = (jnp.arange(slots.shape[1])[None, :] < w) & (slots >= 0)
  rec = [("selection: query slots", slots)]
  with recording(rec):
    logits, _, mass = (
        sampler._prefill(m, tokens, slots, pred, aux.cache) if prefill else
        sampler._flash(m, tokens, slots, pred, window, aux.cache))
  rec += [("attention mass, summed over layers", mass),
          *zip(("confidence: argmax token", "confidence"),
               parallel_rules.confidence(logits))]
  trace = sampler.step_trace(m, state, p)._asdict()
  rec += [("step" + jax.tree_util.keystr(k), v)
          for k, v in jax.tree_util.tree_leaves_with_path(trace)]
  return {f"{i:04d} {name}": v for i, (name, v) in enumerate(rec)}


def diff(a, b, n):
  """(elements of rows [:n] that differ bitwise, max abs diff)."""
  if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
    a, b = jax.random.key_data(a), jax.random.key_data(b)
  a, b = np.asarray(a[:n]), np.asarray(b[:n])
  if a.shape != b.shape:
    return -1, float("nan")
  if a.dtype.kind in "fV":  # floats, bfloat16: compare the bits
    bits = np.dtype(f"uint{8 * a.dtype.itemsize}")
    a, b, (x, y) = a.view(bits), b.view(bits), (a.astype(float), b.astype(float))
  else:
    x, y = a.astype(float), b.astype(float)
  count = int(np.sum(a != b))
  return count, float(np.max(np.abs(x - y))) if count else 0.0


def compare_states(sa, sb, n):
  """({leaf: (count, max abs)} over shared rows [:n], (steps A ran, B ran))."""
  ran, out = (int(sa.step), int(sb.step)), {}
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(sa),
                          jax.tree_util.tree_leaves(sb)):
    key = jax.tree_util.keystr(path)
    if a.ndim and (ran[0] == ran[1] or key in FROZEN):
      count, big = diff(a, b, n)
      if count:
        out[key] = (count, big)
  return out, ran


def summary(d):
  """'leaf count (max m)', per-layer leaves summed as [*]."""
  g = {}
  for leaf, (c, m) in d.items():
    key = re.sub(r"\[\d+\]", "[*]", leaf)
    g[key] = (g.get(key, (0, 0))[0] + c, max(g.get(key, (0, 0))[1], m))
  return ", ".join(f"{k} {c} (max {m:.3g})" for k, (c, m) in g.items())


@functools.lru_cache(maxsize=None)
def _programs(opts, mesh):
  """(decode, pieces) jitted, one pair per mesh (its context is traced in)."""
  static = ("config", "sampler")
  return (jax.jit(decode_state, static_argnames=static,
                  compiler_options=dict(opts) if opts else None),
          jax.jit(probe_step, static_argnames=static + ("prefill",),
                  compiler_options=dict(opts) if opts else None))


def side(params, config, sampler, ids, valid, seeds, mesh=None, opts=None):
  """One batch's (state(k), pieces(state, prefill)), over `mesh` if given;
  opts: XLA compiler options."""
  if mesh is not None:  # odd rows: repeat the last, as generate._decode_rows
    pad = -len(ids) % parallel.data_size(mesh)
    ids, valid, seeds = (np.concatenate([np.asarray(x), np.repeat(
        np.asarray(x)[-1:], pad, 0)]) for x in (ids, valid, seeds))
  args = [jnp.asarray(ids), jnp.asarray(valid),
          jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))]
  if mesh is not None:
    args = [parallel.shard_rows(mesh, x) for x in args]
    params = parallel.shard_params(mesh, params)
  dec, step = _programs(tuple(sorted((opts or {}).items())), mesh)

  def run(fn, *more, **kws):
    with parallel.use(mesh):  # traced under the mesh, as generate does
      return fn(params, *more, config=config, sampler=sampler, **kws)

  return (lambda k: run(dec, *args, jnp.int32(k)),
          lambda state, prefill: run(step, *args[:2], state, prefill=prefill))


def probe(a, b, n, steps, pieces=True, log=print):
  """Parts 1 and 2 of the module docstring for sides a and b (`side`),
  shared rows [:n]; pieces: run part 2 (Flash-Cache samplers only)."""
  report, seen, last, hi = {"steps": [], "first_diff_step": None,
                            "pieces": None, "first_piece": None}, {}, 0, None

  def at(k):
    if k not in seen:
      seen[k] = compare_states(a[0](k), b[0](k), n)
    return seen[k]

  for k in steps:
    d, ran = at(k)
    report["steps"].append({"k": k, "ran": ran, "diff": d})
    log(f"step {k:4d} (loop ran A {ran[0]}, B {ran[1]}): "
        + (summary(d) or "identical"))
    if hi is None:
      hi, last = (k, last) if d else (None, k)
    if max(ran) < k:
      break  # both loops have stopped: later steps are the same
  if hi is None:
    log("no difference for the shared rows at any checked step")
    return report
  while hi - last > 1:  # bisect: last agrees, hi differs
    mid = (last + hi) // 2
    last, hi = (last, mid) if at(mid)[0] else (mid, hi)
  report["first_diff_step"] = hi
  log(f"first differing step: {hi} (state at {last} agrees): "
      + summary(at(hi)[0]))
  if not pieces:
    log("piece report: only for the Flash-Cache samplers")
    return report
  sa, sb = a[0](last), b[0](last)
  prefill = bool(np.all(np.asarray(sa.aux.fresh_B)))
  pa, pb = a[1](sa, prefill), b[1](sb, prefill)
  report["pieces"] = [dict(zip(("piece", "diff", "max_abs"),
                               (key[5:], *diff(pa[key], pb[key], n))))
                      for key in sorted(pa)]
  bad = [r for r in report["pieces"] if r["diff"]]
  log(f"step {hi} pieces ({'prefill' if prefill else 'flash'} forward), "
      f"{len(bad)} of {len(pa)} differ; the first ones:")
  for r in bad[:12]:
    log(f"  {r['piece']:40s} {r['diff']:9d} elements, max abs {r['max_abs']:.3g}")
  if not any(r["piece"].startswith("step") for r in bad):
    log("NOTE: the recorded one-step program does not reproduce the "
        "difference (XLA fuses it otherwise than the decode loop)")
  report["first_piece"] = bad[0]["piece"] if bad else None
  log(f"FIRST DIFFERING PIECE: {report['first_piece']}")
  return report


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--checkpoint",
                  default=str(ROOT / "checkpoints/synthetic-gsm-llada-16m"))
  ap.add_argument("--data", default=str(ROOT / "data/synthetic_gsm"))
  ap.add_argument("--strategy", default="flash-cache")
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--sub", type=int, default=64)
  ap.add_argument("--limit", type=int, default=None,
                  help="rows from the first LIMIT problems only (as the eval)")
  ap.add_argument("--bucket-with", type=int, default=None, metavar="INDEX",
                  help="the bucket holding this problem, not the largest")
  ap.add_argument("--sub-mesh", help="batch B over this mesh, e.g. data=2")
  ap.add_argument("--gen-length", type=int, default=128)
  ap.add_argument("--steps", default="1,2,4,8,16,32,64,128,256")
  ap.add_argument("--cpu-ynnpack", action="store_true",
                  help="compile with XLA's defaults, without generate's "
                  "CPU_/GPU_COMPILER_OPTIONS")
  ap.add_argument("--xla-note", default="", help="free text, echoed")
  ap.add_argument("--json", help="write the report here")
  args = ap.parse_args(argv)
  from flash_dllm_jax.checkpoint import load
  from flash_dllm_jax.strategies import build_sampler
  t0, dev, flags = time.time(), jax.devices()[0], os.environ.get("XLA_FLAGS")
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"{jax.device_count()} x {dev.device_kind}; XLA_FLAGS={flags!r}; "
        f"note: {args.xla_note}", flush=True)
  params, config, tok = load(args.checkpoint)
  sampler = build_sampler(args.strategy, config.arch,
                          {"gen_length": args.gen_length})
  ids, valid, seeds = bucket_rows(tok, config, args.data, args.batch,
                                 args.limit, args.bucket_with)
  n = min(args.sub, len(ids))
  opts = compiler_options() if not args.cpu_ynnpack else None
  print(f"{args.strategy}: batch A {len(ids)} rows, B the first {n}"
        f"{' over ' + args.sub_mesh if args.sub_mesh else ''}; prompt "
        f"{ids.shape[1]}, gen {args.gen_length}; compiler options {opts}")
  a = side(params, config, sampler, ids, valid, seeds, None, opts)
  b = side(params, config, sampler, ids[:n], valid[:n], seeds[:n],
           parallel.parse_mesh(args.sub_mesh), opts)
  steps = sorted({int(s) for s in args.steps.split(",")
                  if 0 < int(s) < sampler.num_steps} | {sampler.num_steps})
  report = probe(a, b, n, steps, isinstance(sampler, FlashDLLMSampler),
                 log=lambda s: print(s, flush=True))
  report.update(jax=jax.__version__, backend=jax.default_backend(),
                device=dev.device_kind, xla_flags=flags, note=args.xla_note,
                args=vars(args), seconds=round(time.time() - t0, 1))
  print(f"done in {report['seconds']:.0f} s")
  if args.json:
    Path(args.json).write_text(json.dumps(report, indent=1, default=str))
  return report


if __name__ == "__main__":
  main()
