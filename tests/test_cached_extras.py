"""Cached forwards for Flash-Cache: verify passes, hidden slots, attention mass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import CachedExtras, init_params
from flash_dllm_jax.sampling.sequence_model import SequenceModel

B, N = 2, 40


def filled(arch, impl=None, head_dim=16, seed=0):
  """A model over a left-padded batch, with the cache filled by a prefill of
  *other* tokens (so any slot not rewritten is visibly stale)."""
  config = ModelConfig.tiny(arch, head_dim=head_dim)
  params = init_params(config, jax.random.key(seed), param_dtype=jnp.float32)
  valid = jnp.arange(N)[None, :] >= jnp.array([[0], [7]])
  model = SequenceModel.for_batch(config, params, valid, implementation=impl)
  stale = jax.random.randint(jax.random.key(seed + 1), (B, N), 0, 370)
  slots = jnp.broadcast_to(jnp.arange(N), (B, N))
  _, cache = jax.jit(model.cached)(stale, slots,
                                   model.empty_cache(jnp.float32))
  return model, cache


def run(model, *args, **kwargs):
  """model.run jitted (op by op it would compile every small program)."""
  return jax.jit(model.run, static_argnames="mass_from_layer")(*args,
                                                               **kwargs)


def query(seed=5):
  slots = jnp.array([[31, 4, 17, 22, 9], [39, 12, 30, 8, -1]])
  tokens = jax.random.randint(jax.random.key(seed), slots.shape, 0, 370)
  return tokens, slots


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_verify_pass_equals_writing_then_attending_and_keeps_the_cache(arch):
  """Hiding the query slots and letting the queries see each other's fresh
  keys is the same attention as overwriting those slots first."""
  model, cache = filled(arch)
  tokens, slots = query()
  written = run(model, tokens, slots, cache)
  real = slots >= 0
  extras = CachedExtras(
      write_cache=False,
      exclude_BxS=jnp.zeros((B, N), bool).at[
          jnp.arange(B)[:, None], jnp.where(real, slots, N)].set(True,
                                                                 mode="drop"),
      inq_mask_BxQxQ=real[:, None, :] & real[:, :, None])
  verify = run(model, tokens, slots, cache, extras=extras)
  np.testing.assert_allclose(verify.logits[real], written.logits[real],
                             rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(verify.cache), jax.tree.leaves(cache)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_attention_mass_accounts_for_every_probability(arch):
  model, cache = filled(arch)
  tokens, slots = query()
  rows = jnp.array([[True, True, False, True, False],
                    [False, True, True, True, False]])
  from_layer = 1
  out = run(model, tokens, slots, cache,
            extras=CachedExtras(mass_rows_BxQ=rows),
            mass_from_layer=from_layer)
  mass = np.asarray(out.mass_BxS)
  layers = model.config.n_layers - from_layer
  # Each selected row spreads probability 1 per head over the valid slots.
  np.testing.assert_allclose(mass.sum(1), rows.sum(1) * model.config.n_heads
                             * layers, rtol=1e-5)
  assert (mass[1, :7] == 0).all()  # padding slots get nothing
  assert (mass >= 0).all()
  none = run(model, tokens, slots, cache)
  assert none.mass_BxS is None
  np.testing.assert_array_equal(none.logits, out.logits)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_kernel_path_matches_reference_for_verify_and_mass(arch, monkeypatch):
  from pallas_kernels.attention import reference as attention_ref
  tokens, slots = query()
  real = slots >= 0
  rows = real & (jnp.arange(5)[None, :] % 2 == 0)
  inq = real[:, None, :] & real[:, :, None] & (
      jnp.arange(5)[:, None] >= jnp.arange(5)[None, :])
  extras = CachedExtras(write_cache=False, inq_mask_BxQxQ=inq,
                        mass_rows_BxQ=rows)
  ref_model, cache = filled(arch, "reference", head_dim=64)
  want = run(ref_model, tokens, slots, cache, extras=extras)

  def no_fallback(*args, **kwargs):
    raise AssertionError("the kernel path fell back to the reference")
  monkeypatch.setattr(attention_ref, "scheduled_attention", no_fallback)
  kernel_model = SequenceModel(ref_model.config, ref_model.params,
                               ref_model.positions_BxN, ref_model.valid_BxN,
                               "pallas_interpret")
  got = run(kernel_model, tokens, slots, cache, extras=extras)
  np.testing.assert_allclose(got.logits[real], want.logits[real], rtol=1e-4,
                             atol=1e-4)
  np.testing.assert_allclose(got.mass_BxS, want.mass_BxS, rtol=1e-4,
                             atol=1e-5)
