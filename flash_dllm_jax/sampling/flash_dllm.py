"""Flash-dLLM's Flash-Cache (VILA-Lab/Flash-dLLM, `verify=False` path).

Every step pushes a fixed budget of query positions per row through the whole
model against a KV cache that covers the full sequence:
  window  block_m masked positions, best confidence (as last scored) first,
          never-scored ones in position order;
  tracked newly committed positions, then the other positions (decoded,
          or masks dropped after a stop token) that drew the most attention
          mass from the window in the previous step (track budget
          track_num * block_m);
  extra   the next (mask_num - 1) * block_m masked positions in that order,
          refreshed but not decoded.
Their fresh K/V overwrite their slots; everything else is read from the
cache. The first step runs every position (a prefill) so the cache starts
complete. The window is decoded with the confidence threshold (at least one
commit per step); masked positions after a committed stop token are dropped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.model import CachedExtras, KVCache
from flash_dllm_jax.sampling import parallel_rules, select
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

NOT_SCORED = -1.0  # rank of masked positions that have never been scored


@struct.dataclass
class FlashCacheAux:
  """Per-row bookkeeping carried through the loop.

  cache: KV of every slot. rank_BxN: last confidence of each masked position
  (NOT_SCORED if never scored). mass_BxN: attention mass each slot drew from
  the window in the last step. new_BxN: positions committed in the last step.
  """

  cache: KVCache
  rank_BxN: jax.Array
  mass_BxN: jax.Array
  new_BxN: jax.Array


@dataclasses.dataclass(frozen=True)
class FlashDLLMSampler:
  """Flash-Cache decoding; defaults follow the reference GSM8K script.

  recompute_all: run every position uncached each step instead (the
  exactness reference: with a budget covering the whole sequence the cached
  run must equal it).
  """

  gen_length: int = 256
  block_m: int = 16
  track_num: int = 4
  mask_num: int = 4
  threshold: float = 0.9
  mass_from_layer: int = 2
  recompute_all: bool = False

  def __post_init__(self):
    errors = []
    for name in ("gen_length", "block_m", "track_num", "mask_num"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < (0 if name == "track_num" else 1):
        errors.append(f"{name} must be a positive int, got {value!r}")
    if not 0 < self.threshold <= 1:
      errors.append(f"threshold must be in (0, 1], got {self.threshold}")
    if not isinstance(self.mass_from_layer, int) or self.mass_from_layer < 0:
      errors.append(f"mass_from_layer must be an int >= 0, got "
                    f"{self.mass_from_layer!r}")
    if errors:
      raise ValueError("invalid Flash-dLLM arguments: " + "; ".join(errors))

  @property
  def num_steps(self) -> int:
    return self.gen_length  # at least one commit per step

  @property
  def extra_masks(self) -> int:
    return (self.mask_num - 1) * self.block_m

  @property
  def query_budget(self) -> int:
    return self.block_m * (1 + self.track_num) + self.extra_masks

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    if prompt_len + self.gen_length > max_seq_len:
      raise ValueError(f"prompt ({prompt_len}) + gen_length "
                       f"({self.gen_length}) exceeds max_seq_len {max_seq_len}")

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    if model.config.logits_shift:
      raise ValueError("Flash-dLLM is implemented for LLaDA-style models; "
                       "Dream's shifted logits are not supported yet")
    b, n = tokens_BxN.shape
    return FlashCacheAux(cache=model.empty_cache(),
                         rank_BxN=jnp.full((b, n), NOT_SCORED, jnp.float32),
                         mass_BxN=jnp.zeros((b, n), jnp.float32),
                         new_BxN=jnp.zeros((b, n), bool))

  # Query selection -----------------------------------------------------------
  def _candidates(self, model, tokens_BxN, prompt_len):
    """(open_BxN: masked positions still part of the answer; others_BxN:
    every other real position — decoded tokens, and masks dropped after a
    stop token — which may only be refreshed as tracked positions)."""
    cfg = model.config
    n = tokens_BxN.shape[1]
    gen_BxN = jnp.arange(n)[None, :] >= prompt_len
    masked_BxN = (tokens_BxN == cfg.mask_token_id) & gen_BxN
    stop_BxN = jnp.isin(tokens_BxN, jnp.asarray(cfg.stop_token_ids)) & gen_BxN
    first_stop_B = jnp.where(stop_BxN.any(1), jnp.argmax(stop_BxN, 1), n)
    open_BxN = masked_BxN & (jnp.arange(n)[None, :] < first_stop_B[:, None])
    return open_BxN, model.valid_BxN & ~open_BxN

  def _select(self, aux, open_BxN, decoded_BxN):
    """slots_BxQ (-1 = unused) laid out as [window | extra masks | tracked]."""
    w, x = self.block_m, self.extra_masks
    t = self.query_budget - w - x
    mask_key_BxN = jnp.where(open_BxN, -aux.rank_BxN, jnp.inf)
    mask_order_BxN = jnp.argsort(mask_key_BxN, axis=1, stable=True)
    n_open_B = open_BxN.sum(1)
    take = lambda order, count, k, start=0: jnp.where(
        jnp.arange(start, start + k)[None, :] < count[:, None],
        _pad_take(order, start, k), -1)
    window_BxW = take(mask_order_BxN, n_open_B, w)
    extra_BxX = take(mask_order_BxN, n_open_B, x, start=w)
    track_key_BxN = jnp.where(decoded_BxN,
                              -jnp.where(aux.new_BxN, jnp.inf, aux.mass_BxN),
                              jnp.inf)
    track_order_BxN = jnp.argsort(track_key_BxN, axis=1, stable=True)
    tracked_BxT = take(track_order_BxN, decoded_BxN.sum(1), t)
    return jnp.concatenate([window_BxW, extra_BxX, tracked_BxT], axis=1)

  # One step ------------------------------------------------------------------
  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    cfg, tokens_BxN, aux = model.config, state.tokens_BxN, state.aux
    b, n = tokens_BxN.shape
    w, x = self.block_m, self.extra_masks
    open_BxN, decoded_BxN = self._candidates(model, tokens_BxN, prompt_len)
    slots_BxQ = self._select(aux, open_BxN, decoded_BxN)
    scored_BxR = slots_BxQ[:, :w + x]
    window_rows_BxQ = (jnp.arange(slots_BxQ.shape[1])[None, :] < w) & (
        slots_BxQ >= 0)

    if self.recompute_all:
      logits_BxRxV = model.logits(tokens_BxN, jnp.maximum(scored_BxR, 0))
      cache, mass_BxN = aux.cache, aux.mass_BxN  # no cache, no mass
    else:
      logits_BxRxV, cache, mass_BxN = jax.lax.cond(
          state.step == 0,
          lambda: self._prefill(model, tokens_BxN, slots_BxQ, aux.cache),
          lambda: self._flash(model, tokens_BxN, slots_BxQ, window_rows_BxQ,
                              aux.cache))

    x0_BxR, conf_BxR = parallel_rules.confidence(logits_BxRxV)
    real_BxR = scored_BxR >= 0
    is_stop_BxR = jnp.isin(x0_BxR, jnp.asarray(cfg.stop_token_ids)) & real_BxR
    # Window positions after a predicted stop token get no confidence.
    first_stop_B = jnp.min(jnp.where(is_stop_BxR[:, :w], scored_BxR[:, :w], n),
                           axis=1)
    conf_w_BxW = jnp.where(scored_BxR[:, :w] > first_stop_B[:, None], 0.0,
                           conf_BxR[:, :w])
    commit_BxW = parallel_rules.threshold_commit(conf_w_BxW, real_BxR[:, :w],
                                                 self.threshold)
    rows_Bx1 = jnp.arange(b)[:, None]
    commit_slots_BxW = jnp.where(commit_BxW, scored_BxR[:, :w], n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, commit_slots_BxW].set(
        x0_BxR[:, :w].astype(tokens_BxN.dtype), mode="drop")
    new_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, commit_slots_BxW].set(
        True, mode="drop")
    rank_BxN = aux.rank_BxN.at[rows_Bx1, jnp.where(real_BxR, scored_BxR, n)
                               ].set(conf_BxR, mode="drop")
    aux = FlashCacheAux(cache=cache, rank_BxN=rank_BxN, mass_BxN=mass_BxN,
                        new_BxN=new_BxN)
    return tokens_BxN, aux, 1

  def _prefill(self, model, tokens_BxN, slots_BxQ, cache):
    """Step 0: every position, so the cache starts complete."""
    b, n = tokens_BxN.shape
    w, x = self.block_m, self.extra_masks
    all_BxN = jnp.broadcast_to(jnp.arange(n), (b, n))
    # Score rows sit at their own positions in an all-position query.
    rows_BxR = jnp.maximum(slots_BxQ[:, :w + x], 0)
    window_BxN = jnp.zeros((b, n), bool).at[
        jnp.arange(b)[:, None], jnp.where(slots_BxQ[:, :w] >= 0,
                                          slots_BxQ[:, :w], n)].set(
                                              True, mode="drop")
    out = model.run(tokens_BxN, all_BxN, cache, rows_BxR,
                    extras=CachedExtras(mass_rows_BxQ=window_BxN),
                    mass_from_layer=self.mass_from_layer)
    return out.logits, out.cache, self._mass(out.mass_BxS, b, n)

  def _flash(self, model, tokens_BxN, slots_BxQ, window_rows_BxQ, cache):
    b, n = tokens_BxN.shape
    w, x = self.block_m, self.extra_masks
    q_tokens_BxQ = jnp.take_along_axis(tokens_BxN, jnp.maximum(slots_BxQ, 0),
                                       axis=1)
    rows_BxR = jnp.broadcast_to(jnp.arange(w + x), (b, w + x))
    out = model.run(q_tokens_BxQ, slots_BxQ, cache, rows_BxR,
                    extras=CachedExtras(mass_rows_BxQ=window_rows_BxQ),
                    mass_from_layer=self.mass_from_layer)
    return out.logits, out.cache, self._mass(out.mass_BxS, b, n)

  def _mass(self, mass_BxS, b, n):
    if mass_BxS is None:  # every layer is below mass_from_layer
      return jnp.zeros((b, n), jnp.float32)
    return mass_BxS


def _pad_take(order_BxN: jax.Array, start: int, k: int) -> jax.Array:
  """order[:, start:start + k], padded with -1 where it runs past N."""
  n = order_BxN.shape[1]
  if start >= n:
    return jnp.full((order_BxN.shape[0], k), -1, order_BxN.dtype)
  part = order_BxN[:, start:start + k]
  pad = k - part.shape[1]
  if pad:
    part = jnp.concatenate(
        [part, jnp.full((order_BxN.shape[0], pad), -1, order_BxN.dtype)], 1)
  return part
