"""DiffusionGemma's forward against Google's own model: a tiny checkpoint
in the official format (orbax tree + config.json) and the official
forward's outputs on the sampler's calls, both built from the genuine
google-deepmind/gemma code by tools/diffusion_gemma_fixtures.py."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import architectures, checkpoint, quantize
from flash_dllm_jax.architectures.diffusion_gemma import model as M
from flash_dllm_jax.architectures.diffusion_gemma.checkpoint import (
    init_params, param_shapes)
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    GemmaConfig, preset)
from tests.paths import ROOT

REF = ROOT / "tests" / "reference" / "diffusion_gemma"
TOL = 1e-3
# One compiled program per shape, shared by the tests (eager is slower).
FORWARD = jax.jit(M.forward, static_argnums=(1,), static_argnames=("logits",))
ROWS = jax.jit(M.forward_rows, static_argnums=(1,),
               static_argnames=("logits",))


@pytest.fixture(scope="module")
def tiny():
  params, config, tokenizer = checkpoint.load(REF / "tiny", dtype="float32")
  return params, config, dict(np.load(REF / "forward.npz"))


def _run(params, config, ref, tag, cache, sc=None, canvas=False):
  slots = jnp.asarray(ref[f"{tag}_positions"])
  last = M.canvas(slots) if canvas else M.causal(slots)
  length = cache[0]["k"].shape[1]
  # The slot interface reproduces the official global and local masks.
  np.testing.assert_array_equal(
      M.mask(config, "global", slots, last, length), ref[f"{tag}_mask"])
  if canvas:
    local = M.mask(config, "local", slots, last, length)
    official = ref[f"{tag}_local_mask"] & (np.abs(
        np.arange(length)[None, None] - np.asarray(slots)[..., None])
        < config.sliding_window)
    np.testing.assert_array_equal(local, official)
  logits, cache = FORWARD(params, config, jnp.asarray(ref[f"{tag}_tokens"]),
                            slots, cache, last,
                            None if sc is None else jnp.asarray(sc))
  np.testing.assert_allclose(logits, ref[f"{tag}_logits"], atol=TOL, rtol=0)
  return cache


def test_forward_matches_the_official_model(tiny):
  params, config, ref = tiny
  assert config.layer_kinds == ("local", "local", "global") * 2
  assert config.sliding_window < ref["step0_tokens"].shape[1]
  quantize.check_params(params, config)
  # A plain causal forward, one row right-padded (slot -1: nothing kept).
  tokens = ref["plain_tokens"]
  valid = tokens != 0
  slots = jnp.asarray(np.where(valid, np.cumsum(valid, 1) - 1, -1))
  logits, _ = FORWARD(params, config, jnp.asarray(tokens), slots,
                        M.empty_cache(config, 2, tokens.shape[1]), slots)
  np.testing.assert_allclose(np.asarray(logits)[valid],
                             ref["plain_logits"][valid], atol=TOL, rtol=0)
  # Prefill, two denoising steps (zero, then non-zero self-conditioning),
  # the append of the canvas, a second canvas after it.
  cache = M.empty_cache(config, 2, ref["step0_mask"].shape[-1])
  cache = _run(params, config, ref, "prefill", cache)
  _run(params, config, ref, "step0", cache, ref["step0_sc"], canvas=True)
  _run(params, config, ref, "step1", cache, ref["step1_sc"], canvas=True)
  np.testing.assert_allclose(
      M.encode_logits(params, config, jnp.asarray(ref["encode_in"])),
      ref["encode_out"], atol=TOL, rtol=0)
  cache = _run(params, config, ref, "append", cache)
  end = int(ref["cache_layer_0_end_index"][0])
  for layer in (0, 2):
    for kv in ("k", "v"):
      np.testing.assert_allclose(
          np.asarray(cache[layer][kv])[:, :end],
          ref[f"cache_layer_{layer}_{kv}"][:, :end], atol=TOL, rtol=0)
  _run(params, config, ref, "step2", cache, ref["step2_sc"], canvas=True)


def test_a_row_gets_its_alone_answer_in_a_batch(tiny):
  """forward_rows: a canvas row (self-conditioned, against a cache) in a
  batch of two has the bits it has alone; and the same values as forward."""
  params, config, ref = tiny
  tokens = jnp.asarray(ref["step0_tokens"])
  slots = jnp.asarray(ref["step0_positions"])
  sc = jnp.asarray(ref["step1_sc"])
  cache = M.empty_cache(config, 2, 32)
  batch, _ = ROWS(params, config, tokens, slots, cache, M.canvas(slots), sc)
  alone, _ = ROWS(params, config, tokens[1:], slots[1:],
                  M.empty_cache(config, 1, 32), M.canvas(slots[1:]), sc[1:])
  np.testing.assert_array_equal(batch[1:], alone)
  whole, _ = FORWARD(params, config, tokens, slots, cache, M.canvas(slots),
                     sc)
  np.testing.assert_allclose(batch, whole, atol=1e-4, rtol=0)


def test_registry_preset_and_loading_errors(tiny, tmp_path):
  params, config, _ = tiny
  assert "diffusion_gemma" in architectures.names()
  assert architectures.get("diffusion_gemma").default_strategy == (
      "diffusion-gemma")
  big = preset("DiffusionGemma_26B_A4B")
  assert big.layer_kinds.count("global") == 5 and big.n_layers == 30
  total = sum(int(np.prod(s)) for s in param_shapes(big).values())
  assert 25.0e9 < total < 25.5e9  # "25.2B parameters"
  # A bfloat16 load keeps the tree and casts every leaf.
  bf16, cfg16, _ = checkpoint.load(REF / "tiny", dtype="bfloat16")
  assert cfg16.dtype == "bfloat16" and {
      x.dtype for x in jax.tree.leaves(bf16)} == {jnp.dtype("bfloat16")}
  # Without config.json a tree matches no preset: one clear line.
  bare = tmp_path / "bare"
  shutil.copytree(REF / "tiny", bare)
  (bare / "config.json").unlink()
  with pytest.raises(ValueError, match="match no built-in preset"):
    checkpoint.load(bare)
  # A config whose shapes disagree with the stored tree.
  meta = json.loads((REF / "tiny" / "config.json").read_text())
  meta["transformer_config"]["num_kv_heads"] = 1
  (bare / "config.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="does not match its config: "
                     "layer_0/attn/kv_einsum/w has shape"):
    checkpoint.load(bare)
  meta["transformer_config"]["attention_types"] = ["SLIDING"]
  (bare / "config.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="unknown attention type 'SLIDING'"):
    checkpoint.load(bare)
  with pytest.raises(ValueError, match="input size 32 divisible by 128"):
    checkpoint.load(REF / "tiny", quantize="int8-g128")
  with pytest.raises(ValueError, match="per_layer_input_dim=256"):
    GemmaConfig.from_official({**meta["transformer_config"],
                               "per_layer_input_dim": 256})
  # Random parameters have the official tree's shapes.
  rand = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
  assert jax.tree.map(lambda a: a.shape, rand) == jax.tree.map(
      lambda a: a.shape, params)


def test_a_request_with_images_gets_one_clear_error():
  """DiffusionGemma is text only (as every family here): an image part
  fails with one line in generate's prompt checks (the server's refusal,
  naming the family, is tested through the real server in
  test_serve_openai)."""
  from flash_dllm_jax import prompts
  parts = [{"type": "text", "text": "What is this?"},
           {"type": "image_url", "image_url": {"url": "data:image/png,"}}]
  with pytest.raises(ValueError, match="prompt, message 0 holds an image"):
    prompts.check_messages([{"role": "user", "content": parts}])


def test_8bit_weights_run_what_they_stand_for(tiny):
  """load(quantize="int8"): every projection (experts included) held in 8
  bits; the forward equals the float forward of the weights they stand
  for (kernel_q * scale)."""
  from flash_dllm_jax.architectures.diffusion_gemma.quant import (
      dequantize_tree)
  params, config, ref = tiny
  qparams, qconfig, _ = checkpoint.load(REF / "tiny", dtype="float32",
                                        quantize="int8")
  assert qconfig.quantize == "int8" and quantize.is_quantized(qparams)
  quantize.check_params(qparams, qconfig)
  assert qparams["layer_2"]["mlp"]["gating_einsum"]["w"]["kernel_q"].dtype == (
      jnp.int8)
  plain = dequantize_tree(qparams, param_shapes(config))
  tokens = jnp.asarray(ref["step0_tokens"])
  slots = jnp.asarray(ref["step0_positions"])
  sc = jnp.asarray(ref["step1_sc"])
  cache = M.empty_cache(config, 2, 32)
  got, _ = FORWARD(qparams, qconfig, tokens, slots, cache, M.canvas(slots), sc)
  want, _ = FORWARD(plain, config, tokens, slots, cache, M.canvas(slots), sc)
  np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


SAVE_ON_ANOTHER_DEVICE = """
import sys
import jax
from flash_dllm_jax.architectures.diffusion_gemma import checkpoint
params, config, _ = checkpoint.load(sys.argv[1], dtype="float32")
params = jax.device_put(params, jax.devices()[1])
checkpoint.save(sys.argv[2], params, config)
"""


def test_a_tree_saved_from_devices_this_process_lacks_loads(tiny, tmp_path):
  # Google's checkpoints are written from TPUs, ours from a GPU: the orbax
  # tree names devices a CPU process does not have (here cpu:1).
  import os
  import subprocess
  import sys
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-c", SAVE_ON_ANOTHER_DEVICE,
                  str(REF / "tiny"), str(tmp_path / "moved")],
                 check=True, env=env, cwd=ROOT, timeout=300)
  assert len(jax.devices()) == 1
  params, _, _ = tiny
  moved, _, _ = checkpoint.load(tmp_path / "moved", dtype="float32")
  jax.tree.map(np.testing.assert_array_equal, moved, params)
