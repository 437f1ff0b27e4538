"""The pieces of DiffusionGemma's official denoising step (gemma/diffusion/
_sampler.py and _early_stopping.py), restated per row: the annealed
temperature, entropy-bound acceptance with renoising, the early-stop rules,
the truncation at end tokens, and the random draws (the per-row options
they read: canvas_options.py).

Every random draw is taken with the row's own key in the shape the official
code draws for a batch of one ([1, C]), so a row's tokens never depend on
the batch; the calls and their order (split, then randint / categorical)
are the official ones, so a row alone gets its tokens bit for bit.

Shapes: B rows, C canvas positions, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PAD = 0  # the official PAD_TOKEN: what follows an end token in a canvas
EARLY_STOPS = ("chained", "token_stability", "none")  # and "entropy:<bound>"
CHAINED_ENTROPY = 0.005  # the default rule's EntropyEarlyStop threshold


def parse_early_stop(rule: str) -> tuple[bool, float | None]:
  """(token stability required, entropy bound or None) of an `early_stop`
  value; ValueError names the accepted forms. "none" is (False, None)."""
  if rule == "chained":
    return True, CHAINED_ENTROPY
  if rule == "token_stability":
    return True, None
  if rule == "none":
    return False, None
  if isinstance(rule, str) and rule.startswith("entropy:"):
    try:
      bound = float(rule.split(":", 1)[1])
    except ValueError:
      bound = float("nan")
    if bound == bound and abs(bound) != float("inf"):
      return False, bound
  raise ValueError(f"early_stop must be one of {', '.join(EARLY_STOPS)} or "
                   f"entropy:<bound> (a finite number), got {rule!r}")


def split2(keys_B):
  """(first, second) halves of jax.random.split of each row's key."""
  pairs = jax.vmap(jax.random.split)(keys_B)
  return pairs[:, 0], pairs[:, 1]


def random_tokens(keys_B, length: int, n_ids: int):
  """[B, length]: each row's randint(key, (1, length), 0, n_ids)."""
  draw = lambda k: jax.random.randint(k, shape=(1, length), minval=0,
                                      maxval=n_ids)[0]
  return jax.vmap(draw)(keys_B)


def noise_proportions(steps: int):
  """[steps + 1]: 1 - i / steps, the noise level at each step boundary."""
  return 1.0 - jnp.arange(steps + 1) / steps


def shape_logits(logits_BxCxV, temperature_B):
  """AnnealingTemperatureShaper's last step: logits / T per row, in the
  logits' dtype (T: canvas_options.temperatures, the annealed schedule
  from max_temperature at noise 1 to min_temperature at noise 0)."""
  dtype = logits_BxCxV.dtype
  return (logits_BxCxV / temperature_B.astype(dtype)[:, None, None]
          ).astype(dtype)


def token_entropy(logits_BxCxV):
  """[B, C] entropy of softmax(logits) (0 * log 0 taken as 0)."""
  log_probs = jax.nn.log_softmax(logits_BxCxV)
  probs = jnp.exp(log_probs)
  safe = jnp.where(probs == 0, 0.0, log_probs)
  return -jnp.sum(safe * probs, axis=-1)


def token_logprob(logits_BxCxV, tokens_BxC):
  """[B, C] log softmax(logits)[token] at each position (float32)."""
  lp = jax.nn.log_softmax(logits_BxCxV.astype(jnp.float32))
  return jnp.take_along_axis(lp, tokens_BxC[..., None], axis=-1)[..., 0]


def accept(shaped_BxCxV, keys_B, entropy_bound_B, n_ids: int):
  """SampleFromPredictions: a draw from the shaped logits at every
  position; the lowest-entropy positions are kept while the entropy summed
  before them is <= the row's entropy_bound_B (so at least one for a
  bound >= 0, none for a negative one), the rest
  renoised with uniform ids in [0, n_ids)."""
  denoised_BxC, keep_BxC, noise_BxC = draws(shaped_BxCxV, keys_B,
                                            entropy_bound_B, n_ids)
  return jnp.where(keep_BxC, denoised_BxC, noise_BxC)


def draws(shaped_BxCxV, keys_B, entropy_bound_B, n_ids: int):
  """accept's parts: (the draws [B, C], the positions the entropy bound
  keeps [B, C], the uniform renoising ids [B, C]), in the official order
  of the random calls."""
  categorical_keys, noise_keys = split2(keys_B)
  logits = shaped_BxCxV.astype(jnp.float32)
  draw = lambda k, l: jax.random.categorical(k, l[None])[0]
  denoised_BxC = jax.vmap(draw)(categorical_keys, logits)
  entropy_BxC = token_entropy(logits)
  order_BxC = jnp.argsort(entropy_BxC, axis=-1)
  sorted_BxC = jnp.take_along_axis(entropy_BxC, order_BxC, axis=-1)
  before_BxC = jnp.cumsum(sorted_BxC, axis=-1) - sorted_BxC
  b = order_BxC.shape[0]
  keep_BxC = jnp.zeros_like(order_BxC, dtype=jnp.bool_).at[
      jnp.arange(b)[:, None], order_BxC].set(before_BxC <= entropy_bound_B[:, None])
  noise_BxC = random_tokens(noise_keys, order_BxC.shape[1], n_ids)
  return denoised_BxC, keep_BxC, noise_BxC


def truncate(canvas_BxC, is_end_BxC):
  """(canvas with PAD after its first end token, [B] has an end token);
  is_end_BxC: the positions holding an end token."""
  c = canvas_BxC.shape[1]
  has_B = jnp.any(is_end_BxC, axis=-1)
  first_B = jnp.where(has_B, jnp.argmax(is_end_BxC, axis=-1), c)
  keep = jnp.arange(c)[None, :] <= first_B[:, None]
  return jnp.where(keep, canvas_BxC, PAD), has_B
