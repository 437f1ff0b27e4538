"""A NumPy restatement of Fast-dLLM v1 decoding for one sequence, for tests.

Written from the published algorithm (NVlabs/Fast-dLLM llada/generate.py:
`generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`,
`get_transfer_index`, and `get_transfer_index_dynamic` from v1), as a host
loop over two model callbacks, independent of the compiled sampler:

  full(x [N]) -> (logits [N, V], kv): a whole-sequence forward that also
    returns the KV cache of every position;
  cached(x_q [Q], slots [Q], kv) -> (logits [Q, V], kv): the queries' K/V
    overwrite their slots, then they attend over the whole cache.

Dream (shift 1) reads position i from logits row i-1; its cached queries start
one position before the block (the project's documented adaptation).
"""

import numpy as np


def _confidence(logits):
  """Greedy tokens and their softmax probability, in float64."""
  logits = logits.astype(np.float64)
  x0 = logits.argmax(-1)
  z = logits - logits.max(-1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  return x0, np.take_along_axis(p, x0[:, None], -1)[:, 0]


def transfer_threshold(conf, masked, tau):
  """get_transfer_index with a threshold: top-1 always, others iff >= tau."""
  conf = np.where(masked, conf, -np.inf)
  k = int(masked.sum())
  order = np.argsort(-conf, kind="stable")[:k]
  chosen = np.zeros(len(conf), bool)
  for rank, i in enumerate(order):
    chosen[i] = rank == 0 or conf[i] >= tau
  return chosen


def transfer_factor(conf, masked, factor):
  """get_transfer_index_dynamic, including its loop-variable edge case."""
  conf = np.where(masked, conf, -np.inf)
  m = int(masked.sum())
  chosen = np.zeros(len(conf), bool)
  if m == 0:
    return chosen
  threshs = [1 - factor / (n + 1) for n in range(1, m + 1)]
  threshs[0] = -1
  sorted_conf = np.sort(conf[masked])[::-1]
  for top_i in range(m):
    if sorted_conf[top_i] < threshs[top_i]:
      break
  if top_i == 0 or top_i == m - 1:
    top_i += 1
  chosen[np.argsort(-conf, kind="stable")[:top_i]] = True
  return chosen


def fast_dllm_generate(full, cached, prompt, *, gen_length, block_length,
                       cache, mask_id, shift=0, threshold=0.9, factor=None):
  """Returns (x [N], nfe, quirks): quirks[blk] is True when block blk paid
  for a cached call after its block-start step had already finished it."""
  p = len(prompt)
  x = np.concatenate([np.asarray(prompt), np.full(gen_length, mask_id)])
  n = len(x)
  nfe = 0
  quirks = []

  def commit(logits_L, lo):
    block = x[lo:lo + block_length]  # a view: commits write into x
    masked = block == mask_id
    x0, conf = _confidence(logits_L)
    if factor is None:
      chosen = transfer_threshold(conf, masked, threshold)
    else:
      chosen = transfer_factor(conf, masked, factor)
    block[chosen] = x0[chosen]

  for blk in range(gen_length // block_length):
    lo = p + blk * block_length
    hi = lo + block_length
    block_done = lambda: not (x[lo:hi] == mask_id).any()
    if cache == "none":
      while True:  # `generate`: a full forward per step
        logits, _ = full(x)
        nfe += 1
        commit(logits[lo - shift:hi - shift], lo)
        if block_done():
          break
      quirks.append(False)
      continue
    logits, kv = full(x)  # block start: decode and fill the cache
    nfe += 1
    commit(logits[lo - shift:hi - shift], lo)
    quirks.append(block_done())
    while True:  # the mask check follows the cached call
      q_hi = hi if cache == "dual" else n
      slots = np.arange(lo - shift, q_hi)
      logits, kv = cached(x[lo - shift:q_hi], slots, kv)
      nfe += 1
      commit(logits[:block_length], lo)
      if block_done():
        break
  return x, nfe, quirks
