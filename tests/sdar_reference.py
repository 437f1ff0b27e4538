"""Plain-Python restatement of SDAR's `block_diffusion_generate` (JetAstra/
SDAR generate.py) for one prompt, a host loop over a logits callback, for
tests only; entropy_bounded as JetEngine's scheduler has it.

logits_fn(x [1, W]) -> logits [1, W, V] must apply the block-causal mask
over positions arange(W) (sdar_fixtures.torch_logits). The reference runs
the prompt's whole blocks once (store_kv=True), then each block's steps
against that K/V cache and one more forward of the finished block to store
its K/V; with a block-causal mask the cached K/V are those of a forward of
the whole prefix, so each forward here runs the prefix window and keeps
the current block's rows; the calls are counted as the reference makes
them (`prefill`, `denoise`, `store`).

Sampling: temperature 0 is argmax with x0_p = softmax(logits)[x0] (the
reference always samples); the static / dynamic top-k takes only masks
(the reference's k larger than the masks left picks -inf positions too;
tests avoid that case). Ties go to the lower position.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tests.llada2_reference import num_transfer_tokens


@dataclasses.dataclass(frozen=True)
class Generation:
  """x: the canvas after the prompt (whole blocks, masks where undecoded);
  prefill / denoise / store: the reference's model calls of each kind."""
  x: np.ndarray
  prefill: int
  denoise: int
  store: int


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _top(conf: np.ndarray, k: int) -> np.ndarray:
  order = np.argsort(-conf, kind="stable")[:k]
  return order[np.isfinite(conf[order])]


def generate(logits_fn, prompt, mask_id: int, stop_ids, gen_length: int,
             block_length: int, denoising_steps: int, remasking_strategy: str,
             confidence_threshold: float = 0.85, eb_threshold: float = 0.35,
             temperature: float = 0.0) -> Generation:
  assert temperature == 0, "greedy only: the reference draws with torch"
  p, bl = len(prompt), block_length
  num_blocks = (p + gen_length + bl - 1) // bl
  x = np.full(num_blocks * bl, mask_id, np.int64)
  x[:p] = prompt
  prefill_blocks = p // bl
  calls = dict(prefill=int(prefill_blocks > 0), denoise=0, store=0)
  k_steps = num_transfer_tokens(bl, denoising_steps)
  for b in range(prefill_blocks, num_blocks):
    lo, hi = b * bl, (b + 1) * bl
    cur = x[lo:hi].copy()
    for step in range(denoising_steps):
      mask = cur == mask_id
      if not mask.any():
        calls["store"] += 1
        break
      window = np.concatenate([x[:lo], cur])[None]
      logits = logits_fn(window)[0, lo:hi].astype(np.float64)
      x0 = logits.argmax(-1)
      probs = _softmax(logits)
      x0_p = probs[np.arange(bl), x0]
      calls["denoise"] += 1
      k = int(k_steps[step])
      conf = np.where(mask, x0_p, -np.inf)
      transfer = np.zeros(bl, bool)
      if remasking_strategy == "low_confidence_static":
        transfer[_top(conf, k)] = True
      elif remasking_strategy == "low_confidence_dynamic":
        high = conf > confidence_threshold
        if high.sum() >= k:
          transfer = high
        else:
          transfer[_top(conf, k)] = True
      elif remasking_strategy == "entropy_bounded":
        pc = np.maximum(probs[mask], 1e-12)
        ent = -(pc * np.log(pc)).sum(-1)
        order = np.argsort(ent, kind="stable")
        kk = int(np.searchsorted(np.cumsum(ent[order]), eb_threshold,
                                 side="left"))
        transfer[np.flatnonzero(mask)[order[:max(kk, 1)]]] = True
      else:
        raise ValueError(remasking_strategy)
      cur[transfer] = x0[transfer]
      if step == denoising_steps - 1:  # no mask left but under
        calls["store"] += 1  # entropy_bounded, whose block JetEngine ends
        break  # after its steps, masks or not
    x[lo:hi] = cur
    if np.isin(x[p:], list(stop_ids)).any():
      break
  return Generation(x[p:], **calls)
