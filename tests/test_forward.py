"""The public forward `logits` against the transformers oracles (logits and
hidden states) and the independent forward (left padding), plus errors."""

import numpy as np
import pytest
import torch

import flash_dllm_jax
from flash_dllm_jax import forward
from tests import hf_fixtures, independent_forward
from tests.test_parity import MAX_REL_ERR, max_rel_err


@pytest.fixture(scope="module", params=["llada", "dream"])
def hf_model(request, tmp_path_factory):
  """(model loaded in float32 from the HF directory, oracle)."""
  write = {"llada": hf_fixtures.write_llada, "dream": hf_fixtures.write_dream}
  src, oracle = write[request.param](
      tmp_path_factory.mktemp(request.param) / "hf", seed=4)
  return flash_dllm_jax.load(src, dtype="float32"), oracle


def test_logits_and_hidden_states_match_the_oracle(hf_model):
  model, oracle = hf_model
  config = model[1]
  ids_BxN = np.random.default_rng(1).integers(0, config.vocab_size, (2, 13))
  out = flash_dllm_jax.logits(model, ids_BxN, hidden=True)
  ref = hf_fixtures.oracle_logits(oracle, ids_BxN)
  assert out.logits_BxNxV.shape == ref.shape
  assert max_rel_err(np.asarray(out.logits_BxNxV), ref) <= MAX_REL_ERR
  with torch.no_grad():
    hf = oracle(input_ids=torch.as_tensor(ids_BxN),
                attention_mask=torch.zeros(2, 1, 13, 13),
                output_hidden_states=True).hidden_states
  hidden = np.asarray(out.hidden_LxBxNxE)
  assert hidden.shape == (config.n_layers, 2, 13, config.d_model)
  # transformers: hidden_states[l] is block l-1's output for l < L; the last
  # one is after the final norm.
  for layer in range(config.n_layers - 1):
    assert max_rel_err(hidden[layer], hf[layer + 1].numpy()) <= MAX_REL_ERR
  plain = flash_dllm_jax.logits(model, ids_BxN)
  assert plain.hidden_LxBxNxE is None
  np.testing.assert_array_equal(np.asarray(plain.logits_BxNxV),
                                np.asarray(out.logits_BxNxV))


def test_left_padding_matches_the_independent_forward(hf_model):
  model, _ = hf_model
  params, config, _ = model
  rng = np.random.default_rng(2)
  ids_BxN = rng.integers(0, config.vocab_size, (2, 10))
  valid_BxN = np.ones((2, 10), bool)
  valid_BxN[0, :4] = False
  out = np.asarray(flash_dllm_jax.logits(model, ids_BxN, valid=valid_BxN)
                   .logits_BxNxV)
  positions = forward.default_positions(valid_BxN)
  assert positions[0].tolist() == [0, 0, 0, 0, 0, 1, 2, 3, 4, 5]
  ref = np.asarray(independent_forward.forward(
      params, config, ids_BxN, positions,
      np.broadcast_to(valid_BxN[:, None, :], (2, 10, 10)),
      np.broadcast_to(np.arange(10), (2, 10))))
  assert max_rel_err(out[0, 4:], ref[0, 4:]) <= MAX_REL_ERR
  assert max_rel_err(out[1], ref[1]) <= MAX_REL_ERR
  # A padded row's real positions equal the same tokens alone.
  alone = np.asarray(flash_dllm_jax.logits(model, ids_BxN[:1, 4:])
                     .logits_BxNxV)
  assert max_rel_err(out[0, 4:], alone[0]) <= MAX_REL_ERR


def test_precision_and_dtype_options(hf_model):
  model, _ = hf_model
  ids = np.arange(8)[None] + 5
  high = np.asarray(flash_dllm_jax.logits(model, ids).logits_BxNxV)
  bf16 = flash_dllm_jax.logits(model, ids, dtype="bfloat16",
                               precision="default").logits_BxNxV
  assert bf16.dtype == np.float32
  err = max_rel_err(np.asarray(bf16), high)
  assert 0 < err < 0.1  # bfloat16 compute: close, not equal


@pytest.mark.parametrize("kwargs,message", [
    (dict(ids_BxN=np.zeros(4, np.int32)), "2-D integer array"),
    (dict(ids_BxN=np.full((1, 4), 10_000)), "outside"),
    (dict(ids_BxN=np.zeros((1, 4), np.int32), valid=np.ones((1, 5), bool)),
     "valid has shape"),
    (dict(ids_BxN=np.zeros((1, 4), np.int32), precision="max"),
     "precision must be one of"),
])
def test_errors(hf_model, kwargs, message):
  with pytest.raises(ValueError, match=message):
    flash_dllm_jax.logits(hf_model[0], **kwargs)
