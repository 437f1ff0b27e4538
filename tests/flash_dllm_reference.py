"""VILA-Lab Flash-dLLM's decode loop (`generate_with_Flash_dLLM`) restated in
plain Python, one sequence at a time: the test oracle of FlashDLLMSampler.

Written from reading the reference's bookkeeping: the list `full_pos` of
positions (decoded ones first), `num_decoded`, `predicted_length` fixed by
the first commit batch holding EOS, the window as the next `block_m` list
entries, the tracked tail of the list re-sorted each step by the summed
window q.k (from layer 2 on) except the batch committed last, and the verify
pass's rows [T recent | S drafts | S masks] with its mask pattern. The
forward itself is the project's cached forward (tested elsewhere against
transformers), so this checks the loop's rules alone. Without the reference's
EOS tail unless asked for (eos_tail: EOS tokens after the generation up to
the 128-key tiles, keys ending at the last tile). Dream (no reference)
applies the same rules with its logit shift, as FlashDLLMSampler does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.model import CachedExtras
from flash_dllm_jax.sampling import commit_rules, select
from flash_dllm_jax.sampling.sequence_model import SequenceModel


@functools.partial(jax.jit,
                   static_argnames=("config", "stop_ids", "mass_from_layer"))
def _run_jit(params, valid_BxN, tokens, slots, cache, rows, extras, *, config,
             stop_ids, mass_from_layer):
  model = SequenceModel.for_batch(config, params, valid_BxN, stop_ids=stop_ids)
  return model.run(tokens, slots, cache, rows, extras=extras,
                   mass_from_layer=mass_from_layer)


def _run(model, tokens, slots, cache, rows, *, extras, mass_from_layer=0):
  """model.run through one jit per shape (op by op, every op compiles)."""
  return _run_jit(model.params, model.valid_BxN, tokens, slots, cache, rows,
                  extras, config=model.config, stop_ids=model.stop_ids,
                  mass_from_layer=mass_from_layer)


def _forward(model, x, query, cache, logit_rows, *, score_rows, width,
             from_layer, appended=(), exclude=None):
  """Cached forward of positions `query` padded to width with -1, then the
  `appended` positions (Dream's predicting rows)."""
  slots = np.full(width + len(appended), -1, np.int32)
  slots[:len(query)] = query
  slots[width:] = appended
  extras = CachedExtras(
      mass_rows_BxQ=jnp.asarray(np.arange(len(slots)) < score_rows)[None],
      mass_score="logit", exclude_BxS=jnp.asarray(exclude)[None])
  out = _run(model, jnp.asarray(x[np.maximum(slots, 0)])[None],
             jnp.asarray(slots)[None], cache,
             jnp.asarray(np.asarray(logit_rows, np.int32))[None],
             extras=extras, mass_from_layer=from_layer)
  score = None if out.mass_BxS is None else np.asarray(out.mass_BxS[0])
  return out.logits, out.cache, score


def decode(config, params, prompt, *, gen_length, block_m, track_num,
           mask_num, threshold, verify=False, gamma=0.8, budget,
           rank_from_layer=2, eos_tail=False):
  """(gen tokens with masks left as mask_id, steps, forwards) of one prompt."""
  mask_id, eos_id = config.mask_token_id, config.eos_token_id
  p = len(prompt)
  n = keys = p + gen_length
  if eos_tail:  # EOS up to the 128-key tiles; keys end before the last
    keys = (p + gen_length) // 128 * 128 + 128
    n = (p + gen_length + block_m) // 128 * 128 + 128
  model = SequenceModel.for_batch(config, params, jnp.ones((1, n), bool),
                                  stop_ids=config.stop_token_ids)
  exclude = np.arange(n) >= keys
  x = np.array(list(prompt) + [mask_id] * gen_length
               + [eos_id] * (n - p - gen_length), np.int32)
  x_draft = x.copy()
  full_pos = list(range(n))
  num_decoded, predicted_length, eos_fixed = p, p + gen_length, False
  window = full_pos[p:p + block_m]
  tracked = full_pos[:p] + full_pos[p + block_m:keys]
  cache, width = model.empty_cache(), n
  steps = forwards = 0
  shift = config.logits_shift  # Dream reads position i from row i - 1
  while True:
    query = window + tracked
    if not shift:
      rows, appended = list(range(len(window))), ()
    elif width == n:  # the prefill: every position is in the query
      rows, appended = [query.index(q - 1) for q in window], ()
    else:
      rows = [width + i for i in range(len(window))]
      appended = [q - 1 for q in window]
    logits, cache, score = _forward(model, x, query, cache, rows,
                                    score_rows=len(window), width=width,
                                    from_layer=rank_from_layer,
                                    appended=appended, exclude=exclude)
    width = budget
    x0, conf = (np.asarray(a[0, :len(window)])
                for a in commit_rules.confidence(logits))
    forwards += 1
    conf = np.where(eos_fixed & (np.array(window) >= predicted_length), 0.0,
                    conf)
    length_num = (int(np.sum(np.array(window) < predicted_length))
                  if eos_fixed else len(window))
    order = np.argsort(-conf, kind="stable")
    keep = max(int(np.sum(conf >= threshold)), 1)
    x_draft[window] = x0
    full_pos[num_decoded:num_decoded + len(window)] = list(
        np.array(window)[order])
    new = full_pos[num_decoded:num_decoded + keep]
    x[new] = x0[order][:keep]
    num_decoded += keep
    if not eos_fixed and np.any(x[new] == eos_id):
      predicted_length = max(q for q in new if x[q] == eos_id) + 1
      eos_fixed = True
    last_keep = keep
    if verify:
      s = min(max(length_num - keep, 0), block_m // 2)
      cands = full_pos[num_decoded:num_decoded + s]
      keep_v = 0
      if s:
        keep_v = _verify(model, x, x_draft, full_pos[:num_decoded], cands,
                         cache, block_m, gamma,
                         predicted_length if eos_fixed else n + 1, exclude)
        forwards += 1
      new = cands[:keep_v]
      x[new] = x_draft[new]
      num_decoded += keep_v
      if not eos_fixed and np.any(x[new] == eos_id):
        predicted_length = max(q for q in new if x[q] == eos_id) + 1
        eos_fixed = True
      last_keep = keep_v
    steps += 1
    if not any(q < predicted_length for q in full_pos[num_decoded:]):
      return x[p:p + gen_length], steps, forwards
    head = full_pos[:num_decoded - last_keep]
    full_pos[:num_decoded - last_keep] = [
        head[i] for i in np.argsort(score[head], kind="stable")]
    window = full_pos[num_decoded:num_decoded + block_m]
    track_start = max(0, num_decoded - track_num * block_m)
    track_end = min(keys, num_decoded + block_m * mask_num)
    tracked = (full_pos[track_start:num_decoded]
               + full_pos[num_decoded + block_m:track_end])


def _verify(model, x, x_draft, decoded_tail, cands, cache, block_m, gamma,
            end, keyless):
  """The reference's verify pass: how many candidates it accepts. Dream
  reads candidate i from a row at c_i - 1 seeing what mask row i sees; one
  is added per candidate unless c_i - 1 = c_{i-1} (whose draft row is that
  row), and each added row takes a recent row's place."""
  s = len(cands)
  shift = model.config.logits_shift
  need = [bool(shift) and not (i and cands[i - 1] == cands[i] - 1)
          for i in range(s)]
  t = 2 * block_m - 2 * s - sum(need)
  recent = decoded_tail[len(decoded_tail) - t:] if t else []
  t = len(recent)
  q = t + (3 if shift else 2) * s
  rows = recent + cands + cands
  tokens = list(x[recent]) + list(x_draft[cands]) + list(x[cands])
  i = np.arange(s)
  inq = np.ones((q, q), bool)
  inq[:t, t:t + s] = False
  inq[t:t + s, t:t + s] = i[:, None] >= i[None, :]
  inq[t:t + s, t + s:t + 2 * s] = i[:, None] < i[None, :]
  inq[t + s:t + 2 * s, t:t + s] = i[:, None] > i[None, :]
  inq[t + s:t + 2 * s, t + s:t + 2 * s] = i[:, None] <= i[None, :]
  score_rows = list(t + s + i)
  if shift:  # predictor rows: mask view i's visibility, seen by no row
    for k, c in enumerate(cands):
      prev = [j for j in range(k) if cands[j] == c - 1]
      rows.append(c - 1)
      tokens.append(x_draft[c - 1] if prev else x[c - 1])
    inq[t + 2 * s:, :] = inq[t + s:t + 2 * s, :]
    inq[:, t + 2 * s:] = False
    score_rows = list(t + 2 * s + i)
  exclude = keyless.copy()
  exclude[recent + cands] = True
  extras = CachedExtras(write_cache=False,
                        exclude_BxS=jnp.asarray(exclude)[None],
                        inq_mask_BxQxQ=jnp.asarray(inq)[None])
  out = _run(model, jnp.asarray(np.array(tokens, np.int32))[None],
             jnp.asarray(np.array(rows, np.int32))[None], cache,
             jnp.asarray(np.array(score_rows, np.int32))[None], extras=extras)
  p = np.asarray(select.prob_of(out.logits,
                                jnp.asarray(x_draft[cands])[None])[0])
  p = np.where(np.array(cands) >= end, 0.0, p)
  return int(np.sum(np.cumprod(p) >= gamma))
