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
can fix them and the stratification `group` is a property of the estimate,
not of the batching. The copies of all requests then run through the jitted
forward `batch_size` rows at a time, requests of one padded shape sharing a
batch; a copy's loss does not depend on the other rows (per-row positions
and padding, batch-invariant compiler options), so neither does an estimate.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.architectures import LIKELIHOOD_MASKS
from flash_dllm_jax.compilation import _BatchInvariantJit
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import padded_length
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
                cfg: float, block_length: int | None):
  """[B] sum over masked targets of -log p(target) * weight."""
  model = SequenceModel.for_batch(config, params, valid_BxN)
  logits = model.logits(tokens_BxN, rows_BxR, block_length).astype(
      jnp.float32)
  if cfg > 0:
    un = model.logits(uncond_BxN, rows_BxR, block_length).astype(jnp.float32)
    logits = un + (cfg + 1) * (logits - un)
  logp_BxRxV = jax.nn.log_softmax(logits, axis=-1)
  tok_BxR = jnp.take_along_axis(logp_BxRxV, targets_BxR[..., None], -1)[..., 0]
  return -jnp.sum(jnp.where(masked_BxR, tok_BxR, 0.0), -1) * weight_B


# The decode loops' batch-invariant XLA options: a copy's loss does not
# depend on the other rows of its forward.
_row_losses_jit = _BatchInvariantJit(_row_losses,
                                     static_argnames=("config", "cfg", "block_length"))


class Request(NamedTuple):
  """One continuation to score: prefix and target ids, and the target's
  masks [M, L] and weights [M] (draw_masks)."""
  prefix: Sequence[int]
  target: Sequence[int]
  masked_MxL: np.ndarray
  weight_M: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Layout:
  """A request's clean sequence left-padded to N and its target rows padded
  to R (multiples of PROMPT_BUCKET, so requests of similar lengths share a
  compile and a batch); the target starts at `start`."""
  tokens_N: np.ndarray
  uncond_N: np.ndarray
  valid_N: np.ndarray
  rows_R: np.ndarray
  targets_R: np.ndarray
  start: int


def _layout(config: ModelConfig, req: Request) -> _Layout:
  shift, el, p = config.logits_shift, len(req.target), len(req.prefix)
  if shift and not p:
    raise ValueError("Dream needs a prefix token before the continuation")
  if el < 1:
    raise ValueError("the continuation has no tokens")
  m = len(req.weight_M)
  if m < 1 or req.masked_MxL.shape != (m, el):
    raise ValueError(f"masks of shape {req.masked_MxL.shape} and {m} "
                     f"weights for a {el}-token continuation")
  seq = list(req.prefix) + list(req.target)
  n = padded_length(len(seq))
  pad = n - len(seq)
  tokens_N = np.full(n, config.pad_token_id, np.int32)
  tokens_N[pad:] = seq
  uncond_N = tokens_N.copy()
  uncond_N[pad:pad + p] = config.mask_token_id
  rows_R = np.full(padded_length(el), pad + p - shift, np.int32)
  rows_R[:el] = pad + p + np.arange(el) - shift
  targets_R = np.zeros(padded_length(el), np.int32)
  targets_R[:el] = req.target
  return _Layout(tokens_N, uncond_N, np.arange(n) >= pad, rows_R, targets_R,
                 pad + p)


def _batch_arrays(config: ModelConfig, layouts, requests, rows, size: int):
  """The forward's inputs for `rows` [(request, copy)], padded to `size`
  rows by zero-weight copies of the first row (their loss is 0)."""
  padded = list(rows) + [rows[0]] * (size - len(rows))
  out = [[] for _ in range(7)]
  for k, (j, m) in enumerate(padded):
    lay, req = layouts[j], requests[j]
    tokens = lay.tokens_N.copy()
    tokens[lay.start:][req.masked_MxL[m]] = config.mask_token_id
    uncond = lay.uncond_N.copy()
    uncond[lay.start:] = tokens[lay.start:]
    masked = np.zeros(len(lay.rows_R), bool)
    masked[:len(req.target)] = req.masked_MxL[m]
    weight = req.weight_M[m] if k < len(rows) else 0.0
    for dst, value in zip(out, (tokens, uncond, lay.valid_N, lay.rows_R,
                                lay.targets_R, masked, weight)):
      dst.append(value)
  dtypes = (jnp.int32, jnp.int32, bool, jnp.int32, jnp.int32, bool,
            jnp.float32)
  return [jnp.asarray(np.stack(a), d) for a, d in zip(out, dtypes)]


def estimate_many(params, config: ModelConfig, requests: Sequence[Request],
                  *, batch_size: int, cfg: float = 0.0,
                  block_length: int | None = None,
                  progress: Callable[[int], None] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
  """(log-likelihood estimates [R] float64, forwards [R]) of the requests:
  -(1/M) sum_m weight_m * sum over masked l of CE_l for each.
  block_length: a block-causal family's attention blocks (counted from each
  sequence's first token, as its decode counts them); None for full
  attention.

  Copies of requests with the same padded shape run together, batch_size
  rows per forward (the last batch of a shape padded to batch_size, one
  compile per shape); a request's copy losses are summed in copy order, so
  its estimate does not depend on the batching. progress(n) is called as n
  more copies are done. forwards: copies, twice with cfg > 0.
  """
  if not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
  block_causal = config.spec.attention.mask == "block_causal"
  if block_causal != (block_length is not None):
    raise ValueError(f"{config.arch}: block_length is "
                     + ("required" if block_causal else "only for "
                        "block-causal families") + f", got {block_length!r}")
  layouts = [_layout(config, r) for r in requests]
  losses = [np.zeros(len(r.weight_M)) for r in requests]
  by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}
  for j, (lay, req) in enumerate(zip(layouts, requests)):
    by_shape.setdefault((len(lay.tokens_N), len(lay.rows_R)), []).extend(
        (j, m) for m in range(len(req.weight_M)))

  def collect(rows, losses_B):
    for (j, m), loss in zip(rows, np.asarray(losses_B, np.float64)):
      losses[j][m] = loss
    if progress is not None:
      progress(len(rows))

  pending = None  # one batch in flight while the next one is built
  for rows in by_shape.values():
    for s in range(0, len(rows), batch_size):
      chunk = rows[s:s + batch_size]
      out = _row_losses_jit(params, *_batch_arrays(
          config, layouts, requests, chunk, batch_size),
          config=config, cfg=float(cfg), block_length=block_length)
      if pending is not None:
        collect(*pending)
      pending = chunk, out
  if pending is not None:
    collect(*pending)
  values = np.array([-np.sum(l) / len(l) for l in losses], np.float64)
  forwards = np.array([len(l) * (2 if cfg > 0 else 1) for l in losses])
  return values, forwards


def estimate(params, config: ModelConfig, prefix: Sequence[int],
             target: Sequence[int], masked_MxL: np.ndarray,
             weight_M: np.ndarray, *, batch_size: int, cfg: float = 0.0,
             block_length: int | None = None) -> tuple[float, int]:
  """(log-likelihood estimate, forwards) of one request (estimate_many)."""
  values, forwards = estimate_many(
      params, config, [Request(prefix, target, masked_MxL, weight_M)],
      batch_size=batch_size, cfg=cfg, block_length=block_length)
  return float(values[0]), int(forwards[0])
