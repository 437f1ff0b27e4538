"""Plain-Python restatement of LLaDA2MoeModelLM.generate (LLaDA2.0 and
LLaDA2.1 remote code), a host loop over a logits callback, for tests only.

logits_fn(x [1, W]) -> logits [1, W, V] must apply the block-causal mask of
the same block_length over positions arange(W) (e.g. llada2_numpy.forward
with block_length=...). The canvas is prompt + masks padded up to whole
blocks counted from position 0; blocks are refined left to right, each step
calling the model on the whole prefix window [0, end of current block).

Sampling: temperature 0 is greedy, token = argmax(logits) and confidence =
softmax(logits)[token] (the LLaDA2.1 rule; the 2.0 remote code samples from
softmax(logits) even at temperature 0, see the spec). Otherwise logits /
temperature (unless it is 1), then top-k, then top-p filtering, then one
categorical draw from `rng`. Ties in the confidence top-k go to the lower
position (torch.topk leaves their order unspecified).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Generation:
  """tokens: the generated ids after the prompt, cut after the first eos
  (eos included) or at gen_length; calls: model calls made; early_stop:
  whether 2.0's eos_early_stop return was taken (the remote code then
  returns prompt + tokens, this returns tokens only); edits: committed
  tokens 2.1 replaced."""
  tokens: np.ndarray
  calls: int
  early_stop: bool = False
  edits: int = 0


def num_transfer_tokens(block_length: int, steps: int) -> np.ndarray:
  """[steps]: block_length // steps each, the first block_length % steps
  steps one more (sums to block_length)."""
  if steps == 0:
    return np.zeros(0, np.int64)
  out = np.full(steps, block_length // steps, np.int64)
  out[:block_length % steps] += 1
  return out


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def filter_top_k(logits, k):
  """Keeps logits >= the k-th largest (k None or <= 0: no-op)."""
  if k is None or k <= 0:
    return logits
  kth = -np.sort(-logits, axis=-1)[..., k - 1:k]
  return np.where(logits < kth, -np.inf, logits)


def filter_top_p(logits, p):
  """Nucleus filter: drops a token once the cumulative probability of the
  tokens sorted above it exceeds p (the best token always stays)."""
  if p is None or p >= 1.0:
    return logits
  order = np.argsort(-logits, axis=-1, kind="stable")
  cum = np.cumsum(_softmax(np.take_along_axis(logits, order, -1)), -1)
  drop_sorted = np.concatenate(
      [np.zeros_like(cum[..., :1], bool), (cum > p)[..., :-1]], -1)
  drop = np.zeros_like(drop_sorted)
  np.put_along_axis(drop, order, drop_sorted, -1)
  return np.where(drop, -np.inf, logits)


def sample(logits_LxV, temperature=0.0, top_k=None, top_p=None, rng=None):
  """(tokens [L], confidence [L]) as described in the module docstring."""
  logits = np.asarray(logits_LxV, np.float64)
  if temperature == 0.0:
    tok = logits.argmax(-1)
    return tok, np.take_along_axis(_softmax(logits), tok[:, None], -1)[:, 0]
  if temperature > 0 and temperature != 1.0:
    logits = logits / temperature
  probs = _softmax(filter_top_p(filter_top_k(logits, top_k), top_p))
  rng = rng if rng is not None else np.random.default_rng(0)
  tok = np.array([rng.choice(len(p), p=p) for p in probs])
  return tok, probs[np.arange(len(tok)), tok]


def _pick_masks(conf, active, threshold, k):
  """Commit the above-threshold masks if there are at least k of them, else
  the k most confident masks (k capped by the masks left); threshold None
  (the engine's pure schedule) always takes the k most confident."""
  high = (conf > threshold) & active if threshold is not None else None
  if high is not None and high.sum() >= k:
    return high
  pick = np.zeros_like(active)
  order = np.argsort(-conf, kind="stable")[:min(k, int(active.sum()))]
  pick[order] = True
  return pick


def _answer(x, prompt_len, gen_length, eos_id, calls):
  gen = x[prompt_len:prompt_len + gen_length]
  hits = np.nonzero(gen == eos_id)[0]
  return Generation(gen[:hits[0] + 1] if len(hits) else gen, calls)


def _canvas(prompt, gen_length, block_length, mask_id):
  prompt = np.asarray(prompt, np.int64).reshape(-1)
  n_blocks = -(-(len(prompt) + gen_length) // block_length)
  x = np.full(n_blocks * block_length, mask_id, np.int64)
  x[:len(prompt)] = prompt
  return prompt, n_blocks, x


def generate_v20(logits_fn, prompt, *, gen_length, block_length, steps,
                 mask_id, eos_id, threshold=0.95, eos_early_stop=False,
                 temperature=0.0, top_k=None, top_p=None, minimal_topk=1,
                 rng=None) -> Generation:
  """LLaDA2.0 generate: per block at most `steps` refinement steps on the
  num_transfer_tokens schedule; a block stops early once it has no masks;
  the loop ends after the first block whose window holds an eos."""
  steps = min(steps, gen_length // minimal_topk)
  prompt, n_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
  p = len(prompt)
  schedule = num_transfer_tokens(block_length, steps)
  calls = 0
  for blk in range(p // block_length, n_blocks):
    end = (blk + 1) * block_length
    for step in range(steps):
      active = x[end - block_length:end] == mask_id
      if not active.any():
        break
      logits = np.asarray(logits_fn(x[None, :end]))[0, -block_length:]
      calls += 1
      tok, prob = sample(logits, temperature, top_k, top_p, rng)
      conf = np.where(active, prob, -np.inf)
      commit = _pick_masks(conf, active, threshold, int(schedule[step]))
      x[end - block_length:end][commit] = tok[commit]
      if eos_early_stop and (tok[commit] == eos_id).any():
        eos_pos = int(np.nonzero(x[:end] == eos_id)[0][0])
        if (x[p:eos_pos] != mask_id).all():
          return Generation(x[p:eos_pos + 1].copy(), calls, True)
    if (x[p:end] == eos_id).any():
      break
  return _answer(x, p, gen_length, eos_id, calls)


def generate_v21(logits_fn, prompt, *, gen_length, block_length, mask_id,
                 eos_id, threshold=0.95, editing_threshold=0.9,
                 max_post_steps=16, num_to_transfer=1, eos_early_stop=False,
                 temperature=0.0, top_k=None, top_p=None,
                 rng=None) -> Generation:
  """LLaDA2.1 generate (no step schedule; `steps` is unused there;
  editing_threshold None: no edits, an engine option): per
  block, loop: masks get committed by threshold (else the num_to_transfer
  most confident), and already committed non-prompt tokens of the block are
  replaced (edited) where the model now prefers another token with
  probability > editing_threshold. The block ends when a step that started
  without masks edits nothing, or after max_post_steps steps without masks.
  With eos_early_stop, stop after a block once the generated part has no
  masks and holds an eos."""
  prompt, n_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
  p = len(prompt)
  calls = edits = 0
  for blk in range(p // block_length, n_blocks):
    start, end = blk * block_length, (blk + 1) * block_length
    is_prompt = np.arange(start, end) < p
    post_steps = 0
    while True:
      old = x[start:end].copy()
      active = old == mask_id
      if not active.any():
        post_steps += 1
      if post_steps > max_post_steps:
        break
      logits = np.asarray(logits_fn(x[None, :end]))[0, -block_length:]
      calls += 1
      tok, prob = sample(logits, temperature, top_k, top_p, rng)
      commit = np.zeros_like(active)
      if active.any():
        conf = np.where(active, prob, -np.inf)
        commit = _pick_masks(conf, active, threshold, num_to_transfer)
      edit = (~active & ~is_prompt & (tok != old)
              & (editing_threshold is not None and prob > editing_threshold))
      change = commit | edit
      edits += int(edit.sum())
      x[start:end][change] = tok[change]
      if not active.any() and not edit.any():
        break
    if eos_early_stop:
      gen = x[p:end]
      if not (gen == mask_id).any() and (gen == eos_id).any():
        break
  return dataclasses.replace(_answer(x, p, gen_length, eos_id, calls),
                             edits=edits)
