"""Plain NumPy re-statements of the reference samplers, for tests only.

Written from the published algorithm (LLaDA generate.py, Dream _sample) as a
host loop over a logits callback, independent of the compiled implementation.
Greedy (temperature 0) paths only, since RNG streams differ by design.
"""

import numpy as np


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def llada_generate(logits_fn, prompt, *, steps, gen_length, block_length,
                   cfg_scale=0.0, mask_id, eos_id, eot_id, logits_eos_inf=False,
                   confidence_eos_eot_inf=False):
  """logits_fn(x [B, N]) -> [B, N, V] float; returns x [B, N]."""
  b, p = prompt.shape
  x = np.concatenate([prompt, np.full((b, gen_length), mask_id)], 1)
  prompt_index = x != mask_id
  num_blocks = gen_length // block_length
  steps_per_block = steps // num_blocks
  for blk in range(num_blocks):
    lo, hi = p + blk * block_length, p + (blk + 1) * block_length
    n = (x[:, lo:hi] == mask_id).sum(1)
    base, rem = n // steps_per_block, n % steps_per_block
    for i in range(steps_per_block):
      mask_index = x == mask_id
      logits = logits_fn(x).astype(np.float64)
      if cfg_scale > 0:
        un_x = np.where(prompt_index, mask_id, x)
        un = logits_fn(un_x).astype(np.float64)
        logits = un + (cfg_scale + 1) * (logits - un)
      if logits_eos_inf:
        logits[..., eos_id] = -np.inf
      x0 = logits.argmax(-1)
      if confidence_eos_eot_inf:
        logits[..., eos_id] = -np.inf
        logits[..., eot_id] = -np.inf
      with np.errstate(invalid="ignore", divide="ignore"):
        probs = _softmax(logits)
      conf = np.take_along_axis(probs, x0[..., None], -1)[..., 0]
      conf[:, hi:] = -np.inf
      conf = np.where(mask_index, conf, -np.inf)
      x0 = np.where(mask_index, x0, x)
      for row in range(b):
        k = base[row] + (i < rem[row])
        idx = np.argsort(-conf[row], kind="stable")[:k]
        x[row, idx] = x0[row, idx]
  return x


def dream_generate(logits_fn, prompt, *, steps, gen_length, eps, alg, mask_id,
                   timesteps):
  """Greedy maskgit_plus / topk_margin / entropy, with the logit shift."""
  b, p = prompt.shape
  x = np.concatenate([prompt, np.full((b, gen_length), mask_id)], 1)
  for i in range(steps):
    mask_index = x == mask_id
    raw = logits_fn(x).astype(np.float64)
    logits = np.concatenate([raw[:, :1], raw[:, :-1]], 1)
    probs = _softmax(logits)
    x0 = probs.argmax(-1)
    if alg == "maskgit_plus":
      conf = probs.max(-1)
    elif alg == "topk_margin":
      s = -np.sort(-probs, -1)
      conf = s[..., 0] - s[..., 1]
    else:
      conf = (probs * np.log(probs + 1e-10)).sum(-1)
    t, s = timesteps[i], timesteps[i + 1]
    num_mask = np.float32(mask_index.sum() / b)
    k = int(num_mask * (np.float32(1) - s / t)) if i < steps - 1 else int(num_mask)
    conf = np.where(mask_index, conf, -np.inf)
    if k > 0:
      for row in range(b):
        idx = np.argsort(-conf[row], kind="stable")[:k]
        x[row, idx] = x0[row, idx]
  return x
