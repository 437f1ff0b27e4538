"""Converted checkpoints reproduce the transformers oracles' logits.

The oracles (Llama for LLaDA, Qwen2 for Dream) run bidirectionally through an
all-zero 4-D float mask; our model runs in float32 at 'highest' matmul
precision. Dream's raw logits are compared (its shift is a sampler concern).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import checkpoint
from flash_dllm_jax.convert import convert_checkpoint
from flash_dllm_jax.model import Transformer
from tests import hf_fixtures

MAX_REL_ERR = 1e-5


@pytest.fixture(scope="module", params=["llada", "dream"])
def converted(request, tmp_path_factory):
  """(arch, params, config, oracle) of a converted float32 checkpoint."""
  arch = request.param
  root = tmp_path_factory.mktemp(arch)
  write = {"llada": hf_fixtures.write_llada, "dream": hf_fixtures.write_dream}
  src, oracle = write[arch](root / "hf", seed=3)
  convert_checkpoint(src, root / "ckpt", dtype="float32", progress=False)
  params, config, _ = checkpoint.load(root / "ckpt")
  return arch, params, config.replace(dtype="float32"), oracle


@functools.lru_cache(maxsize=None)
def _forward(config):
  """The jitted uncached forward (op by op it would compile every small
  program), one per config."""
  return jax.jit(Transformer(config).apply)


def our_logits(params, config, tokens_BxN, valid_BxN=None):
  """Logits [B, N, V] with positions counted over valid tokens only."""
  tokens_BxN = np.asarray(tokens_BxN)
  if valid_BxN is None:
    valid_BxN = np.ones(tokens_BxN.shape, bool)
  positions_BxN = np.maximum(np.cumsum(valid_BxN, axis=1) - 1, 0)
  with jax.default_matmul_precision("highest"):
    logits_BxNxV, cache = _forward(config)(
        {"params": params}, jnp.asarray(tokens_BxN), jnp.asarray(positions_BxN),
        jnp.asarray(valid_BxN))
  assert cache is None and logits_BxNxV.dtype == jnp.float32
  return np.asarray(logits_BxNxV)


def max_rel_err(ours, ref):
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_logits_match_oracle(converted):
  _, params, config, oracle = converted
  tokens_BxN = np.random.default_rng(0).integers(0, config.vocab_size, (3, 17))
  ref_BxNxV = hf_fixtures.oracle_logits(oracle, tokens_BxN)
  ours_BxNxV = our_logits(params, config, tokens_BxN)
  assert ours_BxNxV.shape == ref_BxNxV.shape == (3, 17, config.vocab_size)
  assert max_rel_err(ours_BxNxV, ref_BxNxV) <= MAX_REL_ERR
  # Large-scale weights give decisive, varied predictions.
  top2 = np.sort(ref_BxNxV, axis=-1)[..., -2:]
  assert np.median(top2[..., 1] - top2[..., 0]) > 1e-2
  assert len(np.unique(ref_BxNxV.argmax(-1))) > 10


def test_attention_is_bidirectional(converted):
  """Changing the last token moves the first position's logits, in both."""
  _, params, config, oracle = converted
  tokens_BxN = np.random.default_rng(1).integers(0, config.vocab_size, (1, 9))
  changed_BxN = tokens_BxN.copy()
  changed_BxN[0, -1] = (changed_BxN[0, -1] + 1) % config.vocab_size
  for run in (lambda t: hf_fixtures.oracle_logits(oracle, t),
              lambda t: our_logits(params, config, t)):
    first, after = run(tokens_BxN)[0, 0], run(changed_BxN)[0, 0]
    assert np.abs(first - after).max() > 1e-3


def test_left_padded_batch_matches_unpadded_rows(converted):
  _, params, config, oracle = converted
  rng = np.random.default_rng(2)
  lengths, n = [15, 6, 11, 1], 15
  tokens_BxN = np.full((len(lengths), n), config.pad_token_id)
  valid_BxN = np.zeros((len(lengths), n), bool)
  rows = [rng.integers(0, config.vocab_size, length) for length in lengths]
  for b, row in enumerate(rows):
    tokens_BxN[b, n - len(row):] = row
    valid_BxN[b, n - len(row):] = True
  ours_BxNxV = our_logits(params, config, tokens_BxN, valid_BxN)
  for b, row in enumerate(rows):
    ref_1xNxV = hf_fixtures.oracle_logits(oracle, row[None])
    assert max_rel_err(ours_BxNxV[b, n - len(row):], ref_1xNxV[0]) <= (
        MAX_REL_ERR)
  # Without the padding mask the padded rows would differ.
  unmasked_BxNxV = our_logits(params, config, tokens_BxN)
  assert max_rel_err(unmasked_BxNxV[1, n - 6:], ours_BxNxV[1, n - 6:]) > 1e-3
