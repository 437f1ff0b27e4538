"""Plain-Python restatement of Fast-dLLM v2's `batch_sample` (NVlabs/
Fast-dLLM v2/generation_functions.py) for one prompt, a host loop over a
logits callback, for tests only; greedy (temperature 0, the reference's
default), whole-block forwards (use_block_cache=False).

logits_fn(x [1, W]) -> logits [1, W, V] must apply the block-causal mask
over positions arange(W) (sdar_fixtures.torch_logits). With
use_block_cache, window_fn(x [W]) -> (logits [W, V], per-layer K/V of the
W positions) and sub_fn(K/V, tokens [S], first position) -> (logits [S, V],
the tokens' K/V) give the remote code's block cache: the K/V of the block's
last whole-block forward, a sub-block's entries replaced by each sub-block
forward (fast_dllm_v2_fixtures.torch_window / torch_sub_block). The reference keeps
the K/V of the prompt's whole blocks (one prefill forward) and of each
finished block (one store forward, whose last row's argmax is the next
block's first token); with a block-causal mask those K/V are the ones a
forward of the whole prefix computes, so each forward here runs the prefix
window and keeps the rows it needs. Calls are counted by kind: `prefill`,
`denoise`, `store` (finished blocks followed by another block) and
`trailing` (the store forward after the last block).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Generation:
  """x: the answer (from the first position after the prompt, masks where
  undecoded); the reference's model calls of each kind."""
  x: np.ndarray
  prefill: int
  denoise: int
  store: int
  trailing: int


def torch_cat(*parts):
  import torch
  return torch.cat(parts, dim=2)


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def generate(logits_fn, prompt, mask_id: int, stop_ids, gen_length: int,
             block_length: int, small_block_length: int,
             threshold: float, use_block_cache: bool = False,
             window_fn=None, sub_fn=None) -> Generation:
  p, bl, sbl = len(prompt), block_length, small_block_length
  assert p != bl, "the reference drops a prompt of exactly one block"
  x = list(prompt)
  calls = dict(prefill=0, denoise=0, store=0, trailing=0)
  if p > bl:  # the prompt's whole blocks; on a boundary, the next token
    calls["prefill"] = 1
    if p % bl == 0:
      x.append(int(logits_fn(np.array([x]))[0, p - 1].argmax()))
  first, n = p // bl, gen_length // bl
  finished = False
  for blk in range(first, first + n):
    lo, hi = blk * bl, (blk + 1) * bl
    x += [mask_id] * (hi - len(x))
    block_kv = None  # the remote code's block_past_key_values
    for s in range(bl // sbl):
      a, b = lo + s * sbl, lo + (s + 1) * sbl
      while any(t == mask_id for t in x[a:b]):
        if not use_block_cache:
          logits = logits_fn(np.array([x[:hi]]))[0, lo:hi]
          shifted = np.concatenate([logits[:1], logits[:-1]])[s * sbl:
                                                              (s + 1) * sbl]
        elif block_kv is None or x[a] == mask_id:
          logits, kv = window_fn(np.array(x[:hi]))
          prefix = [(k[:, :, :lo], v[:, :, :lo]) for k, v in kv]
          block_kv = [[k[:, :, lo:hi].clone(), v[:, :, lo:hi].clone()]
                      for k, v in kv]
          logits = logits[lo:hi]
          shifted = np.concatenate([logits[:1], logits[:-1]])[s * sbl:
                                                              (s + 1) * sbl]
        else:  # keys: the prefix, then the block's without the sub-block
          o, e = a - lo, b - lo
          keep = [(torch_cat(pk, bk[:, :, :o], bk[:, :, e:]),
                   torch_cat(pv, bv[:, :, :o], bv[:, :, e:]))
                  for (pk, pv), (bk, bv) in zip(prefix, block_kv)]
          logits, new = sub_fn(keep, x[a:b], a)
          for layer, (k, v) in enumerate(new):  # in place, as there
            block_kv[layer][0][:, :, o:e] = k
            block_kv[layer][1][:, :, o:e] = v
          shifted = np.concatenate([logits[:1], logits[:-1]])
        shifted = shifted.astype(np.float64)
        x1 = shifted.argmax(-1)
        x1_p = _softmax(shifted)[np.arange(sbl), x1]
        masked = np.array([t == mask_id for t in x[a:b]])
        conf = np.where(masked, x1_p, -np.inf)
        unmask = conf > threshold
        unmask[int(conf.argmax())] = True
        unmask &= masked
        for j in np.flatnonzero(unmask):
          x[a + j] = int(x1[j])
        finished |= bool(np.isin(x1[unmask], list(stop_ids)).any())
        calls["denoise"] += 1
    if finished:
      break
    logits = logits_fn(np.array([x[:hi]]))[0, hi - 1]
    calls["store" if blk < first + n - 1 else "trailing"] += 1
    if blk < first + n - 1:
      x.append(int(logits.argmax()))
  return Generation(np.array(x[p:]), **calls)
