"""On a GPU: the model's cached forward through the Triton kernels equals the
plain-JAX path (bf16, real head_dim 128, GQA)."""

import jax
import jax.numpy as jnp
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import CachedExtras, init_params
from flash_dllm_jax.sampling.sequence_model import SequenceModel

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch,heads,kv", [("llada", 8, 8), ("dream", 14, 2)])
def test_cached_forward_kernels_match_reference_on_gpu(arch, heads, kv):
  config = ModelConfig.tiny(arch, d_model=512, n_heads=heads, n_kv_heads=kv,
                            head_dim=128, mlp_hidden=1024, n_layers=3, max_seq_len=1024,
                            dtype="bfloat16")
  params = init_params(config, jax.random.key(0))
  b, n = 4, 600
  valid = jnp.arange(n)[None, :] >= jnp.array([[0], [37], [0], [300]])
  tokens = jax.random.randint(jax.random.key(1), (b, n), 0, 370)
  slots = jnp.broadcast_to(jnp.arange(n), (b, n))
  sub = jax.random.randint(jax.random.key(2), (b, 48), 300, n)
  sub_tokens = jax.random.randint(jax.random.key(3), (b, 48), 0, 370)
  extras = CachedExtras(mass_rows_BxQ=jnp.arange(48)[None, :] < 16)

  def run(impl):
    model = SequenceModel.for_batch(config, params, valid, implementation=impl)
    _, cache = model.cached(tokens, slots, model.empty_cache())
    out = model.run(sub_tokens, sub, cache, extras=extras, mass_from_layer=1)
    verify = model.run(sub_tokens, sub, cache, extras=CachedExtras(
        write_cache=False, inq_mask_BxQxQ=jnp.ones((b, 48, 48), bool)))
    return out, verify

  (want, want_v), (got, got_v) = run("reference"), run("pallas")
  for g, w in [(got.logits, want.logits), (got_v.logits, want_v.logits)]:
    err = float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w))
    assert err < 2e-2, err
  err = float(jnp.linalg.norm(got.mass_BxS - want.mass_BxS)
              / jnp.linalg.norm(want.mass_BxS))
  assert err < 2e-2, err
