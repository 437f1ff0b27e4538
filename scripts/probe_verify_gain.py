#!/usr/bin/env python
"""Why does Flash-Verify add so few tokens per step?

On the shipped model Flash-dLLM (Flash-Cache + Flash-Verify) decodes only a
little faster per step than Flash-Cache alone. This probe shows where the
verify pass's candidates go, step by step:

  python scripts/probe_verify_gain.py               # 32 problems, block_m 16
  python scripts/probe_verify_gain.py --block-m 64 --json out/v64.json \
      --records out/v64.jsonl

CPU (2 cores), shipped model, gen 192, 32 problems: 80 s at block_m 16 and
130 s at block_m 64 (the stepped probe 28 s / 46 s, the rest loading and the
two generate() runs, compiles included); up to 1.8x that with the cores
shared.

Rows: the first --limit problems of --data's test.jsonl, chat template,
prompt-length buckets and seeds as in the eval (one static batch per
bucket, as generate() without batch_size).
Each bucket runs FlashDLLMSampler(verify=True) (the eval's flash-dllm with
--block-m and --gen-length) one compiled step at a time from Python:
sampler.step_trace, then state.advance, as the decode loop's step does.
Per step and row (--records): the window (answer offsets), the epsilon
(threshold) commits, the verify candidates in draft-confidence order with
their draft confidence, mask-view probability p and cumulative product, the
index where that product falls below gamma, and the accepted candidates.
A candidate is *useful* when it lies at or before the row's final stop
token (the answer's end); the others are positions the answer never uses.

step_trace returns the verify plan, p and keep but not verify's inputs
(window, drafts, confidences, epsilon commits); `capturing_verify` wraps
flash_verify.verify while the step is traced (jit traces once per bucket)
and restores it on exit. The candidates themselves are read from the plan.

Checks, by numpy (exit status 1 if any count is not 0):
  keep_rule: keep == the longest prefix whose cumulative product of p
    stays >= gamma;
  candidates: the plan's candidates (slots and drafts) == the best
    block_m // 2 uncommitted window drafts by confidence;
  not_written: accepted drafts and epsilon commits are in the new tokens;
  accounting: per problem, useful epsilon commits + useful acceptances ==
    the answer's length (each answer token committed exactly once).
Also (reported, not a failure: another XLA program may round otherwise):
rows whose stepped answer or step count differ from generate()'s compiled
loop. Then tokens per step (the eval's: answer tokens with the stop token
over steps, summed over problems) of flash-cache and flash-dllm.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.generate import (bucket_groups,  # noqa: E402
                                     compiler_options, left_pad)
from flash_dllm_jax.sampling import flash_verify  # noqa: E402
from flash_dllm_jax.sampling.sequence_model import SequenceModel  # noqa: E402
from flash_dllm_jax.sampling.state import DecodeState, advance  # noqa: E402

P_BINS = (0, .2, .4, .6, .7, .8, .9, .95, 1.0001)
CHECKS = ("keep_rule", "candidates", "not_written", "accounting")


@contextlib.contextmanager
def capturing_verify():
  """Yields a dict that gets flash_verify.verify's inputs (window_BxW,
  drafts_BxW, conf_BxW, committed_BxW) when a step is traced inside."""
  real, seen = flash_verify.verify, {}

  def spy(model, tokens_BxN, committed_at_BxN, window_BxW, drafts_BxW,
          conf_BxW, committed_BxW, cache, **kwargs):
    seen.update(window_BxW=window_BxW, drafts_BxW=drafts_BxW,
                conf_BxW=conf_BxW, committed_BxW=committed_BxW)
    return real(model, tokens_BxN, committed_at_BxN, window_BxW, drafts_BxW,
                conf_BxW, committed_BxW, cache, **kwargs)

  flash_verify.verify = spy
  try:
    yield seen
  finally:
    flash_verify.verify = real


def traced_step(params, valid_BxN, state, *, config, sampler, prompt_len):
  """(next state, what the probe reads of the step), as loop.make_step."""
  model = SequenceModel.for_batch(config, params, valid_BxN,
                                  stop_ids=config.stop_token_ids)
  with capturing_verify() as seen:
    trace = sampler.step_trace(model, state, prompt_len)
  keys_Bx2 = jax.vmap(jax.random.split)(state.rng_B)
  nxt = advance(state, trace.tokens_BxN, trace.aux, trace.forwards_B,
                prompt_len, config.mask_token_id, config.stop_token_ids,
                keys_Bx2[:, 0])
  plan = trace.plan
  return nxt, dict(seen, tokens_BxN=trace.tokens_BxN, p_BxC=trace.p_BxC,
                   keep_BxC=trace.keep_BxC, S_B=plan.S_B,
                   slots_BxQ=plan.slots_BxQ, tokens_BxQ=plan.tokens_BxQ,
                   kind_BxQ=plan.kind_BxQ, rank_BxQ=plan.rank_BxQ)


@functools.lru_cache(maxsize=None)
def _step_jit(backend):
  return jax.jit(traced_step, compiler_options=compiler_options(backend),
                 static_argnames=("config", "sampler", "prompt_len"))


def plan_candidates(x, c):
  """(slots_BxC, drafts_BxC) of the plan's draft rows, by rank (-1: none)."""
  b = x["kind_BxQ"].shape[0]
  slots_BxC, drafts_BxC = np.full((b, c), -1), np.full((b, c), -1)
  for r in range(b):
    d = x["kind_BxQ"][r] == flash_verify.DRAFT
    slots_BxC[r, x["rank_BxQ"][r, d]] = x["slots_BxQ"][r, d]
    drafts_BxC[r, x["rank_BxQ"][r, d]] = x["tokens_BxQ"][r, d]
  return slots_BxC, drafts_BxC


def check_row(x, r, slots_C, drafts_C, gamma, c):
  """This row-step's mismatch counts (module docstring, checks 1-3)."""
  s, p_C, keep_C = int(x["S_B"][r]), x["p_BxC"][r], x["keep_BxC"][r]
  good_C = np.cumprod(np.where(np.arange(c) < s, p_C, 1.0)) >= gamma
  n_keep = int(np.cumprod(good_C[:s]).sum())
  want_C = np.arange(c) < n_keep
  window_W, conf_W = x["window_BxW"][r], x["conf_BxW"][r]
  rem_W = (window_W >= 0) & ~x["committed_BxW"][r]
  order = np.argsort(np.where(rem_W, -conf_W, np.inf), kind="stable")
  order = order[:min(int(rem_W.sum()), c)]
  new_N = x["tokens_BxN"][r]
  eps_W = x["committed_BxW"][r]
  return dict(
      keep_rule=int((keep_C != want_C).any()),
      candidates=int(s != len(order)
                     or (slots_C[:s] != window_W[order]).any()
                     or (drafts_C[:s] != x["drafts_BxW"][r, order]).any()),
      not_written=int((new_N[slots_C[keep_C]] != drafts_C[keep_C]).sum()
                      + (new_N[window_W[eps_W]]
                         != x["drafts_BxW"][r, eps_W]).sum()))


def row_record(x, r, slots_C, step, before_BxN, prompt_len, mask_id, gamma):
  """One row-step as a JSON-able dict (before_BxN: the tokens the step
  started from); slots are answer offsets."""
  s, keep_C = int(x["S_B"][r]), x["keep_BxC"][r]
  window_W, eps_W = x["window_BxW"][r], x["committed_BxW"][r]
  rem_W = (window_W >= 0) & ~eps_W
  order = np.argsort(np.where(rem_W, -x["conf_BxW"][r], np.inf),
                     kind="stable")[:s]
  p_S = x["p_BxC"][r, :s]
  cum_S = np.cumprod(p_S)
  rnd = lambda a: [round(float(v), 4) for v in a]
  return dict(
      step=step, window=(window_W[window_W >= 0]
                                    - prompt_len).tolist(),
      eps=(window_W[eps_W] - prompt_len).tolist(),
      first_open=int(np.argmax(before_BxN[r, prompt_len:] == mask_id)),
      cand=(slots_C[:s] - prompt_len).tolist(),
      conf=rnd(x["conf_BxW"][r, order]), p=rnd(p_S), cum=rnd(cum_S),
      fail_at=int(np.argmax(cum_S < gamma)) if (cum_S < gamma).any() else None,
      kept=int(keep_C.sum()))


def load_problems(tokenizer, data_dir, limit):
  """(task, its first `limit` problems), chat template as the eval."""
  from flash_dllm_jax.eval.tasks import make_render
  from flash_dllm_jax.eval.tasks.gsm8k import GSM8K
  task = GSM8K(data_dir, num_fewshot=0, chat=True)
  return task, task.problems(make_render(tokenizer, True))[:limit]


def probe_rows(params, config, rows, seeds, sampler, log=print):
  """Steps every bucket (seeds: the problems' indices, which also name
  them); (records, {index: answer end offset}, {index: steps},
  {index: answer ids with the stop}, check counts)."""
  step_fn = _step_jit(jax.default_backend())
  c, gen = sampler.block_m // 2, sampler.gen_length
  stop_ids, mask_id = config.stop_token_ids, config.mask_token_id
  records, ends, steps, answers = [], {}, {}, {}
  checks = dict.fromkeys(CHECKS, 0)
  for group in bucket_groups(rows):
    t0 = time.time()
    ids, valid = left_pad([rows[i] for i in group], config.pad_token_id)
    b, p_len = ids.shape
    valid_BxN = jnp.concatenate([jnp.asarray(valid),
                                 jnp.ones((b, gen), bool)], 1)
    rng_B = jax.vmap(jax.random.key)(jnp.asarray([seeds[i] for i in group],
                                                 jnp.uint32))
    state = DecodeState.start(jnp.asarray(ids), gen, mask_id, rng_B)
    model = SequenceModel.for_batch(config, params, valid_BxN,
                                    stop_ids=stop_ids)
    state = state.replace(aux=sampler.init_aux(model, state.tokens_BxN))
    group_recs = []
    while not bool(state.done_B.all()) and int(state.step) < sampler.num_steps:
      nxt, x = step_fn(params, valid_BxN, state, config=config,
                       sampler=sampler, prompt_len=p_len)
      x = jax.tree.map(np.asarray, x)
      slots_BxC, drafts_BxC = plan_candidates(x, c)
      before_BxN, step = np.asarray(state.tokens_BxN), int(state.step)
      for r in np.flatnonzero(~np.asarray(state.done_B)):
        for k, v in check_row(x, r, slots_BxC[r], drafts_BxC[r],
                              sampler.gamma, c).items():
          checks[k] += v
        group_recs.append(dict(prob=seeds[group[r]], **row_record(
            x, r, slots_BxC[r], step, before_BxN, p_len, mask_id,
            sampler.gamma)))
      state = nxt
    final_BxG = np.asarray(state.tokens_BxN[:, p_len:])
    for r, i in enumerate(group):
      hit = np.flatnonzero(np.isin(final_BxG[r], stop_ids))
      ends[seeds[i]] = int(hit[0]) if hit.size else gen - 1
      steps[seeds[i]] = int(state.steps_B[r])
      answers[seeds[i]] = final_BxG[r, :ends[seeds[i]] + 1].tolist()
    for rec in group_recs:
      mark(rec, ends[rec["prob"]])
    records += group_recs
    log(f"bucket of {b} rows (prompt {p_len}): {int(state.step)} steps, "
        f"{time.time() - t0:.0f} s")
  for prob, end in ends.items():
    mine = [rec for rec in records if rec["prob"] == prob]
    checks["accounting"] += int(sum(rec["useful_eps"] + rec["useful_kept"]
                                    for rec in mine) != end + 1)
  return records, ends, steps, answers, checks


def mark(rec, end):
  """Adds the answer's end and the useful (<= end) counts to a record."""
  useful = [s <= end for s in rec["cand"]]
  rec.update(end=end, useful_eps=sum(s <= end for s in rec["eps"]),
             useful=useful, useful_cand=sum(useful),
             useful_kept=sum(useful[:rec["kept"]]))


def quantiles(a):
  a = np.asarray(a, float)
  if not a.size:
    return None
  return dict(mean=float(a.mean()), q10=float(np.quantile(a, .1)),
              median=float(np.median(a)), q90=float(np.quantile(a, .9)))


def summarize(records, gamma):
  """The summary table's numbers (means are over row-steps)."""
  col = lambda key: np.array([rec[key] for rec in records], float)
  win = np.array([len(rec["window"]) for rec in records])
  eps = np.array([len(rec["eps"]) for rec in records])
  cand = np.array([len(rec["cand"]) for rec in records])
  use_c, use_k, use_e = col("useful_cand"), col("useful_kept"), col(
      "useful_eps")
  tot_e, tot_k = int(use_e.sum()), int(use_k.sum())
  first_p, first_conf, fails, pairs = [], [], collections.Counter(), []
  for rec in records:
    u = [i for i, ok in enumerate(rec["useful"]) if ok]
    if not u:
      continue
    first_p.append(rec["p"][u[0]])
    first_conf.append(rec["conf"][u[0]])
    pairs += [(rec["conf"][i], rec["p"][i]) for i in u]
    fails["all useful kept" if rec["kept"] > u[-1]
          else f"cand {rec['kept'] + 1}"] += 1
  first_p = np.array(first_p)
  conf_u, p_u = (np.array(pairs).T if pairs else (np.zeros(0), np.zeros(0)))
  return dict(
      row_steps=len(records), problems=len({rec["prob"] for rec in records}),
      window_mean=float(win.mean()), eps_mean=float(eps.mean()),
      eps_useful_mean=float(use_e.mean()),
      window_all_eps_share=float(np.mean(eps == win)),
      cand_mean=float(cand.mean()), cand_useful_mean=float(use_c.mean()),
      cand_conf0_mean=float(np.mean([sum(v == 0 for v in rec["conf"])
                                     for rec in records])),
      no_useful_cand_share=float(np.mean(use_c == 0)),
      useful_cand_hist=dict(sorted(collections.Counter(
          use_c.astype(int).tolist()).items())),
      kept_mean=float(col("kept").mean()), kept_useful_mean=float(use_k.mean()),
      useful_kept_hist=dict(sorted(collections.Counter(
          use_k.astype(int).tolist()).items())),
      useful_tokens_eps=tot_e, useful_tokens_verify=tot_k,
      verify_share=tot_k / max(tot_e + tot_k, 1),
      first_useful=dict(
          n=len(first_p), conf=quantiles(first_conf), p=quantiles(first_p),
          p_ge_gamma=float(np.mean(first_p >= gamma)) if first_p.size
          else None,
          p_hist=np.histogram(first_p, bins=P_BINS)[0].tolist()),
      product_fails=dict(sorted(fails.items(), key=lambda kv: (
          kv[0] != "all useful kept", len(kv[0]), kv[0]))),
      useful_cands=dict(
          n=len(p_u), conf_mean=float(conf_u.mean()) if len(p_u) else None,
          p_mean=float(p_u.mean()) if len(p_u) else None,
          p_ge_conf=float(np.mean(p_u >= conf_u)) if len(p_u) else None,
          corr=float(np.corrcoef(conf_u, p_u)[0, 1])
          if len(p_u) > 1 and conf_u.std() and p_u.std() else None))


def tokens_per_step(model, probs, task, gen_length, block_m):
  """{strategy: tokens, steps, tok_per_step, accuracy, answers, steps_by}
  of flash-cache and flash-dllm through generate(), as the eval counts."""
  from flash_dllm_jax.eval.runner import answer_length
  from flash_dllm_jax.strategies import build_sampler
  from flash_dllm_jax.generate import generate
  config = model[1]
  out = {}
  for name in ("flash-cache", "flash-dllm"):
    sampler = build_sampler(name, config.arch, {"gen_length": gen_length,
                                                "block_m": block_m})
    res = generate(model, [p.prompt for p in probs], sampler=sampler,
                   chat=False,
                   seed=[p.index for p in probs])
    lengths = [answer_length(g, config.stop_token_ids) for g in res.tokens_BxG]
    tokens, steps = sum(lengths), int(res.steps_B.sum())
    scores = task.score(probs, res.texts)
    out[name] = dict(
        tokens=tokens, steps=steps, tok_per_step=tokens / steps,
        accuracy=float(np.mean([s["correct"] for s in scores])),
        answers={p.index: res.tokens_BxG[b, :n].tolist()
                 for b, (p, n) in enumerate(zip(probs, lengths))},
        steps_by={p.index: int(res.steps_B[b]) for b, p in enumerate(probs)})
  return out


def table(s, checks, tps, args, gamma):
  """The printed summary (markdown)."""
  f = lambda q: ("-" if q is None else f"{q['mean']:.3f} [q10 {q['q10']:.3f},"
                 f" med {q['median']:.3f}, q90 {q['q90']:.3f}]")
  fu, uc = s["first_useful"], s["useful_cands"]
  num = lambda v, fmt: "-" if v is None else format(v, fmt)
  fc, fd = tps["flash-cache"], tps["flash-dllm"]
  rows = [
      ("problems / row-steps", f"{s['problems']} / {s['row_steps']}"),
      ("window positions (mean)", f"{s['window_mean']:.2f}"),
      ("epsilon commits (mean; useful)",
       f"{s['eps_mean']:.2f}; {s['eps_useful_mean']:.2f}"),
      ("window all committed by epsilon", f"{s['window_all_eps_share']:.0%}"),
      ("verify candidates (mean; useful; conf 0)",
       f"{s['cand_mean']:.2f}; {s['cand_useful_mean']:.2f}; "
       f"{s['cand_conf0_mean']:.2f}"),
      ("row-steps with no useful candidate",
       f"{s['no_useful_cand_share']:.0%}"),
      ("useful candidates: row-steps by count", str(s["useful_cand_hist"])),
      ("verify acceptances (mean; useful)",
       f"{s['kept_mean']:.2f}; {s['kept_useful_mean']:.2f}"),
      ("useful acceptances: row-steps by count", str(s["useful_kept_hist"])),
      ("useful tokens: epsilon / verify (verify share)",
       f"{s['useful_tokens_eps']} / {s['useful_tokens_verify']} "
       f"({s['verify_share']:.1%})"),
      (f"first useful candidate (n={fu['n']}): draft conf", f(fu["conf"])),
      ("first useful candidate: mask-view p", f(fu["p"])),
      (f"first useful candidate: p >= gamma {gamma}",
       num(fu["p_ge_gamma"], ".0%")),
      ("first useful p histogram, bins " + ",".join(
          f"{b:g}" for b in (0, .2, .4, .6, .7, .8, .9, .95, 1)),
       str(fu["p_hist"])),
      ("cumulative product < gamma first at (row-steps with a useful cand)",
       str(s["product_fails"])),
      (f"all useful candidates (n={uc['n']}): conf / p mean",
       f"{num(uc['conf_mean'], '.3f')} / {num(uc['p_mean'], '.3f')}"),
      ("all useful candidates: p >= conf; corr(conf, p)",
       f"{num(uc['p_ge_conf'], '.0%')}; {num(uc['corr'], '.2f')}"),
      ("tok/step flash-cache (verify off)",
       f"{fc['tok_per_step']:.2f} ({fc['tokens']} / {fc['steps']}, "
       f"acc {fc['accuracy']:.3f})"),
      ("tok/step flash-dllm (verify on)",
       f"{fd['tok_per_step']:.2f} ({fd['tokens']} / {fd['steps']}, "
       f"acc {fd['accuracy']:.3f}); "
       f"x{fd['tok_per_step'] / fc['tok_per_step']:.3f}"),
      ("check mismatches (" + ", ".join(CHECKS) + ")",
       ", ".join(str(checks[k]) for k in CHECKS)),
      ("stepped vs compiled flash-dllm: rows differing (answer, steps)",
       f"{checks['stepped_answer_rows']}, {checks['stepped_steps_rows']}"),
  ]
  head = (f"## block_m {args.block_m}, gen {args.gen_length}, gamma {gamma}, "
          f"first {args.limit} problems")
  width = max(len(k) for k, _ in rows)
  return "\n".join([head, "", f"| {'quantity':{width}} | value |",
                    f"|{'-' * (width + 2)}|-------|"]
                   + [f"| {k:{width}} | {v} |" for k, v in rows])


def per_step_lines(records):
  """One line per decode step, summed over the rows still running."""
  by = collections.defaultdict(list)
  for rec in records:
    by[rec["step"]].append(rec)
  out = ["step rows window eps(useful) cand(useful) kept(useful)"]
  for k in sorted(by):
    rs = by[k]
    tot = lambda key: sum(len(r[key]) if isinstance(r[key], list) else r[key]
                          for r in rs)
    out.append(f"{k:4d} {len(rs):4d} {tot('window'):6d} "
               f"{tot('eps'):4d}({tot('useful_eps'):4d}) "
               f"{tot('cand'):4d}({tot('useful_cand'):4d}) "
               f"{tot('kept'):4d}({tot('useful_kept'):4d})")
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--data", type=Path, default=ROOT / "data" / "synthetic_gsm")
  ap.add_argument("--limit", type=int, default=32,
                  help="the first LIMIT problems of test.jsonl")
  ap.add_argument("--block-m", type=int, default=16)
  ap.add_argument("--gen-length", type=int, default=192)
  ap.add_argument("--json", type=Path, help="write the summary here")
  ap.add_argument("--records", type=Path,
                  help="write one JSON line per (step, row) here")
  args = ap.parse_args(argv)
  for name, low in (("limit", 1), ("block_m", 2), ("gen_length", 1)):
    if getattr(args, name) < low:
      ap.error(f"--{name.replace('_', '-')} must be >= {low}")
  from flash_dllm_jax.checkpoint import load
  from flash_dllm_jax.strategies import build_sampler
  t0 = time.time()
  params, config, tok = model = load(args.checkpoint)
  task, probs = load_problems(tok, args.data, args.limit)
  sampler = build_sampler("flash-dllm", config.arch, {
      "gen_length": args.gen_length, "block_m": args.block_m})
  rows = [tok.encode(p.prompt) for p in probs]
  sampler.check_prompt(max(left_pad([r], 0)[0].shape[1] for r in rows),
                       config.max_seq_len)
  seeds = [p.index for p in probs]
  log = lambda s: print(s, file=sys.stderr, flush=True)
  records, ends, steps, answers, checks = probe_rows(
      params, config, rows, seeds, sampler, log)
  t_probe = time.time() - t0
  tps = tokens_per_step(model, probs, task, args.gen_length, args.block_m)
  fd = tps["flash-dllm"]
  checks["stepped_answer_rows"] = sum(answers[i] != fd["answers"][i]
                                      for i in seeds)
  checks["stepped_steps_rows"] = sum(steps[i] != fd["steps_by"][i]
                                     for i in seeds)
  summary = summarize(records, sampler.gamma)
  print("\n".join(per_step_lines(records)))
  print()
  print(table(summary, checks, tps, args, sampler.gamma))
  mismatches = sum(checks[k] for k in CHECKS)
  summary.update(
      args={k: str(v) for k, v in vars(args).items()}, gamma=sampler.gamma,
      checks=checks, mismatches=mismatches,
      tok_per_step={k: {f: v[f] for f in ("tokens", "steps", "tok_per_step",
                                          "accuracy")}
                    for k, v in tps.items()},
      seconds=dict(probe=round(t_probe, 1), total=round(time.time() - t0, 1)))
  print(f"\n{mismatches} check mismatches; {summary['seconds']['total']:.0f} s "
        f"({summary['seconds']['probe']:.0f} s stepping)")
  if args.json:
    args.json.write_text(json.dumps(summary, indent=1))
  if args.records:
    with args.records.open("w") as f:
      for rec in records:
        f.write(json.dumps(rec) + "\n")
  return summary


if __name__ == "__main__":
  sys.exit(1 if main()["mismatches"] else 0)
