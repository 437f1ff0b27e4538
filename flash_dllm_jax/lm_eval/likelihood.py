"""Monte-Carlo log-likelihood of a continuation under a masked-diffusion LM.

log p(target | prefix) >= -E_t E_mask [ sum over masked target tokens of
-log p_theta(token | noisy sequence) / t ], estimated from `mc_num` noisy
copies of prefix + target (the prefix is never masked):

- "count", LLaDA (its `eval_llada.py`): in each group of `group` copies,
  copy i masks exactly x_i of the L target tokens, x_i = round(k + i L /
  group) wrapped into [1, L] for one k ~ U{1..L} per group (stratified
  ratios), the positions a uniform random subset; weight 1 / t_i = L / x_i.
- "rate", Dream (its lm-eval adapter): t_i = (u + i / group) mod 1 for one
  u ~ U[0, 1) per group, p_i = (1 - eps) t_i + eps, each target token masked
  independently with probability p_i; weight 1 / p_i; position j is
  predicted by logits row j - 1 (its logit shift). Unlike that adapter the
  last target token may be masked too (it never masks the sequence's last
  token, which for a one-token continuation would make every estimate 0).
- cfg > 0: unconditional logits from the same copy with the prefix masked,
  mixed as un + (cfg + 1) (cond - un) (LLaDA's `cfg`; Dream's
  `classifier_free_guidance` w is cfg + 1).

Masks are drawn on the host (NumPy, one Generator per request), so a test
can fix them; the forwards run jitted, `group` copies per batch.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.architectures import LIKELIHOOD_MASKS
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import PROMPT_BUCKET
from flash_dllm_jax.sampling.sequence_model import SequenceModel


def draw_masks(rng: np.random.Generator, target_len: int, mc_num: int,
               group: int, scheme: str, eps: float = 1e-3
               ) -> tuple[np.ndarray, np.ndarray]:
  """(masked_MxL bool, weight_M float64) for mc_num copies, stratified in
  groups of `group` (mc_num must be a multiple of it); scheme: "count" or
  "rate" (the module docstring; an Architecture's likelihood_masks)."""
  if scheme not in LIKELIHOOD_MASKS:
    raise ValueError(f"mask scheme must be one of {LIKELIHOOD_MASKS}, "
                     f"got {scheme!r}")
  if target_len < 1:
    raise ValueError("the continuation has no tokens")
  if mc_num % group:
    raise ValueError(f"mc_num {mc_num} is not a multiple of the group {group}")
  el = target_len
  masks, weights = [], []
  for _ in range(mc_num // group):
    if scheme == "count":
      k = int(rng.integers(1, el + 1))
      x = np.round(np.linspace(k, k + (group - 1) * (el / group), group))
      x = ((x.astype(np.int64) - 1) % el) + 1
      for count in x:
        row = np.zeros(el, bool)
        row[rng.permutation(el)[:count]] = True
        masks.append(row)
      weights.append(el / x)
    else:
      t = (rng.random() + np.arange(group) / group) % 1
      p = (1 - eps) * t + eps
      masks.extend(rng.random((group, el)) < p[:, None])
      weights.append(1 / p)
  return np.stack(masks), np.concatenate(weights)


def _row_losses(params, tokens_BxN, uncond_BxN, valid_BxN, rows_BxR,
                targets_BxR, masked_BxR, weight_B, *, config: ModelConfig,
                cfg: float):
  """[B] sum over masked targets of -log p(target) * weight."""
  model = SequenceModel.for_batch(config, params, valid_BxN)
  logits = model.logits(tokens_BxN, rows_BxR).astype(jnp.float32)
  if cfg > 0:
    un = model.logits(uncond_BxN, rows_BxR).astype(jnp.float32)
    logits = un + (cfg + 1) * (logits - un)
  logp_BxRxV = jax.nn.log_softmax(logits, axis=-1)
  tok_BxR = jnp.take_along_axis(logp_BxRxV, targets_BxR[..., None], -1)[..., 0]
  return -jnp.sum(jnp.where(masked_BxR, tok_BxR, 0.0), -1) * weight_B


_row_losses_jit = jax.jit(_row_losses, static_argnames=("config", "cfg"))


def _bucket(n: int) -> int:
  return -(-n // PROMPT_BUCKET) * PROMPT_BUCKET


def estimate(params, config: ModelConfig, prefix: Sequence[int],
             target: Sequence[int], masked_MxL: np.ndarray,
             weight_M: np.ndarray, *, group: int, cfg: float = 0.0
             ) -> tuple[float, int]:
  """(log-likelihood estimate, forwards run) of target after prefix from
  the given masks: -(1/M) sum_m weight_m * sum over masked l of CE_l.

  The sequence is left-padded to a multiple of PROMPT_BUCKET and the target
  rows to one of 32, so requests of similar lengths share a compile.
  """
  shift = config.logits_shift
  if shift and not prefix:
    raise ValueError("Dream needs a prefix token before the continuation")
  seq = list(prefix) + list(target)
  n, el, p = _bucket(len(seq)), len(target), len(prefix)
  pad = n - len(seq)
  r = _bucket(el)
  base_N = np.full(n, config.pad_token_id, np.int32)
  base_N[pad:] = seq
  valid_N = np.arange(n) >= pad
  uncond_N = base_N.copy()
  uncond_N[pad:pad + p] = config.mask_token_id
  rows_R = np.full(r, pad + p - shift, np.int32)
  rows_R[:el] = pad + p + np.arange(el) - shift
  targets_R = np.zeros(r, np.int32)
  targets_R[:el] = target
  total, forwards = 0.0, 0
  for start in range(0, len(weight_M), group):
    m = masked_MxL[start:start + group]
    b = len(m)
    tokens = np.repeat(base_N[None], b, 0)
    tokens[:, pad + p:][m] = config.mask_token_id
    uncond = np.repeat(uncond_N[None], b, 0)
    uncond[:, pad + p:] = tokens[:, pad + p:]
    masked = np.zeros((b, r), bool)
    masked[:, :el] = m
    losses = _row_losses_jit(
        params, jnp.asarray(tokens), jnp.asarray(uncond),
        jnp.asarray(np.repeat(valid_N[None], b, 0)),
        jnp.asarray(np.repeat(rows_R[None], b, 0)),
        jnp.asarray(np.repeat(targets_R[None], b, 0)), jnp.asarray(masked),
        jnp.asarray(weight_M[start:start + group], jnp.float32),
        config=config, cfg=float(cfg))
    total += float(np.sum(np.asarray(losses, np.float64)))
    forwards += b * (2 if cfg > 0 else 1)
  return -total / len(weight_M), forwards
