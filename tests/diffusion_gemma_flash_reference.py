"""diffusion-gemma-flash restated plainly: one prompt alone, a Python loop
over canvases and denoising steps around the plain model forward
(diffusion_gemma/model.py; the prompt prefilled causally a canvas length
at a time, which the decisive setting does not tell from one prefill pass),
every rule written out
in numpy from the descriptions in gemma/diffusion/_sampler.py and
_early_stopping.py (read, not copied) plus the kept-draft rule of flash.py.
The random calls are jax.random's, in the official order, so the tokens
can be compared with the compiled loop's bit for bit where the draws and
the entropy bound's decisions are decisive (the compiled loop's entropies
near 0 carry float32 noise of about 1e-8: a bound of 0 is a coin toss).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.architectures.diffusion_gemma import model as dg


CACHE = 64  # slots: one cache shape for every prompt (slots past a query's
# last key are masked)
# The plain forward, compiled once for a canvas and once for a causal pass
# (the prompt, canvas_length tokens at a time, and each append).
_forward = jax.jit(dg.forward, static_argnums=1, static_argnames="logits")


def decode(params, cfg, prompt, seed, *, canvas_length, max_denoising_steps,
           entropy_bound, max_temperature, min_temperature, max_out_length,
           gamma, early_stop="token_stability"):
  """(answer tokens [max_out_length] (0 past the answer), denoising passes,
  [(kept drafts, renoised positions)] per step) of `prompt` (ids) alone."""
  assert early_stop in ("token_stability", "chained")
  c, steps = canvas_length, max_denoising_steps
  canvases = -(-max_out_length // c)
  n_ids = cfg.n_text_ids
  ends = set(cfg.stop_token_ids)
  p = len(prompt)
  assert p + canvases * c <= CACHE
  cache = dg.empty_cache(cfg, 1, CACHE)
  assert p % c == 0, "the prompt is prefilled canvas_length at a time"
  for at in range(0, p, c):  # causal, in the appends' shape (one program)
    slots = at + jnp.arange(c)[None]
    _, cache = _forward(params, cfg, jnp.asarray([prompt[at:at + c]]), slots,
                        cache, dg.causal(slots), logits=False)
  outer = jax.random.key(seed)
  answer, passes, trace, start = [], 0, [], p
  while True:
    outer, sample = jax.random.split(outer)
    init, inner = jax.random.split(sample)
    canvas = jax.random.randint(init, (1, c), 0, n_ids)
    sc = jnp.zeros((1, c, cfg.d_model), jnp.bfloat16)
    slots = start + jnp.arange(c)[None]
    for step in range(steps):
      logits, cache = _forward(params, cfg, canvas, slots, cache,
                               dg.canvas(slots), sc)
      passes += 1
      noise = np.float32(1) - np.float32(step) / np.float32(steps)
      t = np.float32((np.float32(1) - (np.float32(1) - noise))
                     * np.float32(max_temperature - min_temperature)
                     + np.float32(min_temperature))
      shaped = (logits / t).astype(jnp.float32)
      inner, sample = jax.random.split(inner)
      ck, nk = jax.random.split(sample)
      drafts = np.asarray(jax.random.categorical(ck, shaped))[0]
      noise_ids = np.asarray(jax.random.randint(nk, (1, c), 0, n_ids))[0]
      logp = np.asarray(jax.nn.log_softmax(shaped[0]))  # float32's zeros
      probs = np.exp(logp)
      ent = -np.sum(np.where(probs == 0, 0, logp) * probs, -1)
      accepted = np.zeros(c, bool)
      total = np.float32(0)
      for i in np.argsort(ent, kind="stable"):  # lowest entropy first
        accepted[i] = total <= np.float32(entropy_bound)
        total = total + ent[i]
      kept = ~accepted & (probs[np.arange(c), drafts] >= gamma)
      trace.append((int(kept.sum()), int((~accepted & ~kept).sum())))
      new = np.where(accepted | kept, drafts, noise_ids)
      stable = np.all(probs.argmax(-1) == np.asarray(canvas)[0])
      small = early_stop == "token_stability" or ent.mean() <= 0.005
      sc = dg.encode_logits(params, cfg, shaped).astype(jnp.bfloat16)
      canvas = jnp.asarray(new[None])
      if stable and small:
        break
    final = [int(x) for x in new]
    end = next((i for i, x in enumerate(final) if x in ends), None)
    if end is not None:
      final = final[:end + 1] + [0] * (c - end - 1)
    _, cache = _forward(params, cfg, jnp.asarray([final]), slots, cache,
                        dg.causal(slots), logits=False)
    answer += final
    start += c
    if end is not None or len(answer) >= max_out_length:
      answer = answer[:max_out_length]
      return answer + [0] * (max_out_length - len(answer)), passes, trace
