"""Elastic-Cache's layer-wise forward: each row runs its query rows against
the cache until its attention-drift test fires, then the whole sequence.

Layer l of a row runs one of two passes:
  query  the query rows (slots_BxQ) write their K/V and attend over the
         layer's cache; the drift test compares the tracked rows' (the first
         T query rows) attention with the previous step's;
  full   every position, from the layer's stored input with the query rows
         replaced (the row's first full layer) or from the previous layer's
         full output; its K/V overwrite the whole cache row.
A row runs full from layer 0 when `start_B` and otherwise from the layer
after the first whose similarity is below gamma. Each pass runs (lax.cond)
only when some row takes it, and a row takes its results from exactly one,
so nothing a row computes depends on the other rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from flash_dllm_jax.model import KVCache, layerwise
from flash_dllm_jax.sampling.sequence_model import SequenceModel

COSINE_EPS = 1e-8  # torch.nn.functional.cosine_similarity's eps


class LayerwiseOutput(NamedTuple):
  """logits_BxRxV of the requested query rows; the updated cache and
  hidden states (hidden[l]: x_BxNxE, each position's input to layer l as
  last computed); attended_BxN: the union over layers of the top-track_num
  `trackable` positions by attention mass from the mass rows;
  similarity_BxL (NaN where the layer ran full); restart_B: the first layer
  run full (n_layers if none)."""

  logits_BxRxV: jax.Array
  cache: KVCache
  hidden: tuple[jax.Array, ...]
  attended_BxN: jax.Array
  similarity_BxL: jax.Array
  restart_B: jax.Array


def forward(model: SequenceModel, tokens_BxN, slots_BxQ, mass_rows_BxQ,
            logit_rows: slice, trackable_BxN, start_B, cache: KVCache,
            hidden: tuple[jax.Array, ...], *, tracked: int, track_num: int,
            gamma) -> LayerwiseOutput:
  """slots_BxQ: the query (-1 = unused), its first `tracked` rows the
  tracked tokens; mass_rows_BxQ: rows whose attention picks the next tracked
  tokens; logit_rows: the query rows that get logits; gamma: the drift
  level, a number or [B] (a row's own)."""
  cfg, params, impl = model.config, model.params, model.implementation
  b, n = tokens_BxN.shape
  t = tracked
  rows_Bx1 = jnp.arange(b)[:, None]
  at_BxQ = jnp.maximum(slots_BxQ, 0)
  drop_BxQ = jnp.where(slots_BxQ >= 0, slots_BxQ, n)  # scatter index n: skip
  pos_BxQ = jnp.take_along_axis(model.positions_BxN, at_BxQ, axis=1)
  mass_rows_BxN = jnp.zeros((b, n), bool).at[
      rows_Bx1, jnp.where(mass_rows_BxQ, slots_BxQ, n)].set(True, mode="drop")
  all_BxN = jnp.broadcast_to(jnp.arange(n), (b, n))
  valid_BxN = model.valid_BxN

  x_q = layerwise.embed(cfg, params,
                        jnp.take_along_axis(tokens_BxN, at_BxQ, axis=1))
  # Layer 0's input is the embedding; a query row's stored one is exact too
  # (a position's token only changes when committed, and it is then queried).
  full_input = lambda: layerwise.embed(cfg, params, tokens_BxN)
  carried_B = start_B  # rows whose input is full_input()
  full_B = start_B
  restart_B = jnp.full((b,), cfg.n_layers, jnp.int32)
  ks, vs, new_hidden, sims = [], [], [], []
  attended_BxN = jnp.zeros((b, n), bool)
  for l in range(cfg.n_layers):
    restart_B = jnp.where(full_B & (restart_B == cfg.n_layers), l, restart_B)
    # The tracked rows' previous inputs are read before the stored inputs
    # are written in place (the barrier keeps XLA from moving the read into
    # the query pass, which would keep a copy of the layer's inputs alive).
    past_x, old_h = jax.lax.optimization_barrier((jnp.take_along_axis(
        hidden[l], at_BxQ[:, :t, None], axis=1), hidden[l]))
    merged = old_h.at[rows_Bx1, drop_BxQ].set(x_q, mode="drop")
    x_in = jax.lax.cond(
        jnp.any(carried_B),
        lambda m, f=full_input, c=carried_B: jnp.where(
            c[:, None, None], f(), m),
        lambda m: m, merged)
    new_hidden.append(x_in)

    def full_pass(kv, l=l, x_in=x_in, full_B=full_B):
      slots = jnp.where(full_B[:, None], all_BxN, -1)
      out, kv, mass = layerwise.layer(cfg, params, l, x_in,
                                      model.positions_BxN, valid_BxN, kv,
                                      slots, mass_rows_BxN, impl)
      return kv, (out, mass)

    def query_pass(kv_old, l=l, past_x=past_x, x_q=x_q, full_B=full_B):
      # The drift test: the tracked rows' previous attention (over the keys
      # before this step's writes) against their current one. The barrier
      # orders the read of the old keys before the in-place write.
      p_past = tracked_attention(cfg, params, l, past_x, pos_BxQ[:, :t],
                                 kv_old[0], valid_BxN, impl)
      p_past, kv_old = jax.lax.optimization_barrier((p_past, kv_old))
      slots = jnp.where(full_B[:, None], -1, slots_BxQ)
      out, kv, mass = layerwise.layer(cfg, params, l, x_q, pos_BxQ, valid_BxN,
                                      kv_old, slots, mass_rows_BxQ, impl)
      p_now = tracked_attention(cfg, params, l, x_q[:, :t], pos_BxQ[:, :t],
                                kv[0], valid_BxN, impl)
      sim = head_cosine_mean(p_past, p_now, slots_BxQ[:, :t] >= 0, valid_BxN)
      return kv, (out, mass, sim)

    kv = (cache.k[l], cache.v[l])
    kv, (out_full, mass_full) = _cond(jnp.any(full_B), full_pass, kv)
    kv, (out_q, mass_q, sim_B) = _cond(jnp.any(~full_B), query_pass, kv)
    ks.append(kv[0])
    vs.append(kv[1])
    f_Bx1 = full_B[:, None]
    x_q = jnp.where(f_Bx1[..., None], jnp.take_along_axis(
        out_full, at_BxQ[..., None], axis=1), out_q)
    mass_BxN = jnp.where(f_Bx1, mass_full, mass_q)
    top_BxK, idx_BxK = jax.lax.top_k(
        jnp.where(trackable_BxN, mass_BxN, -jnp.inf), min(track_num, n))
    attended_BxN = attended_BxN.at[rows_Bx1, jnp.where(
        jnp.isfinite(top_BxK), idx_BxK, n)].set(True, mode="drop")
    sims.append(jnp.where(full_B, jnp.nan, sim_B))
    carried_B, full_input = full_B, (lambda out=out_full: out)
    full_B = full_B | (sim_B < gamma)

  logits_BxRxV = layerwise.head(cfg, params, x_q[:, logit_rows], impl)
  return LayerwiseOutput(logits_BxRxV, KVCache(tuple(ks), tuple(vs)),
                         tuple(new_hidden), attended_BxN,
                         jnp.stack(sims, axis=1), restart_B)


def tracked_attention(config, params, index, x_BxTxE, positions_BxT,
                      k_BxSxKxD, valid_BxS, implementation=None):
  """p_BxTxHxS: layer `index`'s per-head attention of the rows whose layer
  input is x_BxTxE over the keys k_BxSxKxD (queries recomputed from the
  inputs, so a past step's attention comes from the stored inputs)."""
  return layerwise.probabilities(layerwise.queries(
      config, params, index, x_BxTxE, positions_BxT, implementation),
                                 k_BxSxKxD, valid_BxS)


def head_cosine_mean(a_BxTxHxS, b_BxTxHxS, rows_BxT, valid_BxS):
  """torch's cosine_similarity(a, b, dim=heads).mean(), over the rows and
  the valid keys only (padding keys would add zeros that depend on how
  much padding the batch needs)."""
  dot = jnp.sum(a_BxTxHxS * b_BxTxHxS, axis=2)
  norm = lambda x: jnp.maximum(jnp.sqrt(jnp.sum(x * x, axis=2)), COSINE_EPS)
  cos_BxTxS = dot / (norm(a_BxTxHxS) * norm(b_BxTxHxS))
  keep_BxTxS = rows_BxT[:, :, None] & valid_BxS[:, None, :]
  count_B = keep_BxTxS.sum((1, 2))
  total_B = jnp.where(keep_BxTxS, cos_BxTxS, 0.0).sum((1, 2))
  return jnp.where(count_B > 0, total_B / jnp.maximum(count_B, 1), 1.0)


def _cond(pred, fn, kv):
  """fn(kv) -> (kv, outputs) if pred, else (kv, zeros shaped like outputs)."""
  shapes = jax.eval_shape(fn, kv)[1]
  skip = lambda kv: (kv, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                      shapes))
  return jax.lax.cond(pred, fn, skip, kv)
