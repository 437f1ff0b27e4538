"""LLaDA2.x: genuine-format loading, the model against the NumPy restatement
of modeling_llada2_moe.py, and strategy `llada2` against the plain-Python
restatement of its generate loop (tests/llada2_reference.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import flash_dllm_jax as fdj
from flash_dllm_jax import architectures
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import convert_checkpoint, tables
from flash_dllm_jax.generate import decode_jit, decode_tokens
from flash_dllm_jax.model import init_params
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.loop import tail_length
from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
from flash_dllm_jax.sampling.row_sampling import GREEDY, Sampling
from tests import llada2_fixtures, llada2_numpy, llada2_reference
from tests.row_sampling_case import (check_rows_equal_own_samplers,
                                     replay_logprobs)
from tests.paths import ROOT

MINI = ROOT / "tests" / "reference" / "llada2-mini"
BL = 8


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """(HF directory, its weights, its config.json dict)."""
  return llada2_fixtures.write_llada2(tmp_path_factory.mktemp("l2") / "hf",
                                      seed=1, n_layers=3)


@pytest.fixture(scope="module")
def model(hf):
  """The fixture loaded in float32 with a sharper head (4x, EOS 10x) so
  that thresholds and EOS stops both happen."""
  params, config, tok = fdj.load(hf[0], dtype="float32")
  head = params["lm_head"] * 4.0
  head = head.at[:, config.eos_token_id].multiply(2.5)
  return {**params, "lm_head": head}, config, tok


def test_config_and_special_ids_come_from_the_genuine_files(hf):
  params, config, tok = fdj.load(hf[0], dtype="float32")
  assert config.arch == "llada2" and config.moe.n_experts == 8
  assert config.rope_dim == 4 and config.spec.attention.mask == "block_causal"
  # config.json names no EOS or mask: the tokenizer's map and fallbacks do
  assert config.mask_token_id == tok.token_to_id("<|mask|>")
  assert config.eos_token_id == tok.token_to_id("<|endoftext|>")
  assert config.eot_token_id == tok.token_to_id("<|role_end|>")
  stack = params["layers_1"]["moe"]
  assert stack["experts_gate"]["kernel"].shape == (8, 32, 16)
  assert stack["router"].dtype == jnp.float32  # kept float32 in any dtype
  assert fdj.load(hf[0])[0]["layers_1"]["moe"]["router"].dtype == jnp.float32
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text.endswith("<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT"
                       "</role>")


@pytest.mark.parametrize("block_length", [None, 4])
def test_forward_matches_the_numpy_restatement(hf, block_length):
  path, weights, hf_config = hf
  model = fdj.load(path, dtype="float32")
  ids = np.random.default_rng(0).integers(0, 290, (2, 21))
  got = fdj.logits(model, ids, block_length=block_length).logits_BxNxV
  want = llada2_numpy.forward(weights, hf_config, ids,
                              block_length=block_length)
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5)
  # Left padding: positions and blocks count from a row's first token.
  padded = np.concatenate([np.zeros((2, 3), np.int64), ids], axis=1)
  valid = np.arange(24)[None].repeat(2, 0) >= 3
  got = fdj.logits(model, padded, valid=valid,
                   block_length=block_length).logits_BxNxV
  np.testing.assert_allclose(np.asarray(got)[:, 3:], want, rtol=0, atol=2e-5)


def test_converted_and_8bit_checkpoints(hf, tmp_path):
  path = hf[0]
  model = fdj.load(path, dtype="float32")
  convert_checkpoint(path, tmp_path / "f32", dtype="float32", progress=False)
  convert_checkpoint(path, tmp_path / "int8", dtype="float32",
                     quantize="int8", progress=False)
  ids = np.random.default_rng(2).integers(0, 290, (2, 16))
  ref = np.asarray(fdj.logits(model, ids, block_length=BL).logits_BxNxV)
  got = fdj.logits(fdj.load(tmp_path / "f32"), ids, block_length=BL)
  np.testing.assert_array_equal(np.asarray(got.logits_BxNxV), ref)
  params, config, _ = fdj.load(tmp_path / "int8")
  experts = params["layers_2"]["moe"]["experts_down"]
  assert config.quantize == "int8"
  assert experts["kernel_q"].shape == (8, 32, 16)  # [X, out, in]
  assert experts["kernel_q"].dtype == jnp.int8
  assert params["layers_2"]["moe"]["router"].dtype == jnp.float32
  got = np.asarray(fdj.logits((params, config, None), ids,
                              block_length=BL).logits_BxNxV)
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.05


# The threshold case with one mask a step (steps = block_length) is
# test_llada21.py's editing-off claim: llada2.1 without edits gives this
# loop's answers on these prompts.
OPTIONS = [dict(threshold=None), dict(threshold=0.6, steps=BL),
           dict(threshold=0.6, eos_early_stop=True)]


@pytest.mark.parametrize("options", OPTIONS, ids=["schedule", "threshold",
                                                   "early-stop"])
def test_generate_equals_the_reference_loop(model, options):
  """Each row of a batch of four prompt lengths gives the reference loop's
  answer and model calls for that prompt alone."""
  config = model[1]
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 16)]
  opts = {"gen_length": 24, "block_length": BL, "steps": 4, **options}
  out = fdj.generate(model, prompts, strategy="llada2", chat=False, **opts)
  logits_fn = lambda x: np.asarray(
      fdj.logits(model, x, block_length=BL).logits_BxNxV)
  early = 0
  for i, prompt in enumerate(prompts):
    ref = llada2_reference.generate_v20(
        logits_fn, prompt, mask_id=config.mask_token_id,
        eos_id=config.eos_token_id, **opts)
    ours = out.tokens_BxG[i]
    stop = np.nonzero(ours == config.eos_token_id)[0]
    assert ours[:stop[0] + 1 if len(stop) else None].tolist() == (
        ref.tokens.tolist()), i
    assert out.forwards_B[i] == ref.calls, i
    early += ref.early_stop
  assert early == (1 if options.get("eos_early_stop") else 0)


def test_sampled_rows_do_not_depend_on_the_batch(model):
  """With logprobs, as the row-settings test below decodes its first row
  alone under this sampler: that decode runs the program compiled here."""
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, 290, n).tolist() for n in (4, 13, 9)]
  opts = dict(strategy="llada2", chat=False, gen_length=16, block_length=BL,
              steps=8, temperature=0.8, top_k=40, top_p=0.9, logprobs=True)
  batch = fdj.generate(model, prompts, seed=[7, 8, 9], **opts)
  alone = fdj.generate(model, prompts[1:2], seed=8, **opts)
  np.testing.assert_array_equal(batch.tokens_BxG[1], alone.tokens_BxG[0])
  assert batch.forwards_B[1] == alone.forwards_B[0]


def test_row_settings_decode_as_the_samplers_own_options(model):
  """Per-row temperature / top_k / top_p and threshold decode, token for
  token, what the sampler built with them decodes for the row alone (the
  greedy row bit for bit the greedy sampler's); logprobs equal a
  replay of the commit steps under the block-causal model's softmax."""
  sampler = LLaDA2Sampler(gen_length=16, block_length=BL, steps=8,
                          temperature=0.7, top_k=40)
  rows = [Sampling(0.8, 0.9, 40), None, GREEDY, Sampling(threshold=0.6)]
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 290, n).tolist() for n in (4, 13, 9, 6)]
  seeds = [7, 8, 9, 10]
  got = check_rows_equal_own_samplers(model, sampler, prompts, seeds, rows)
  full = [sampler.own_sampling() if r is None else r for r in rows]
  want = replay_logprobs(model, sampler, prompts, seeds, full,
                         lambda seq, t: seq.logits(t, jnp.broadcast_to(
                             jnp.arange(t.shape[1]), t.shape), block_length=BL))
  np.testing.assert_allclose(got.logprobs_BxG, want, atol=2e-5)
  assert (want < 0).mean() > 0.5


def test_compiled_loop_equals_the_python_loop(model):
  """`decode_jit` and the Python loop give the same arrays, bit for bit,
  called as generate calls it for the threshold case's batch above (four
  prompts, one mask a step): the compiled side runs that test's program."""
  params, config, _ = model
  sampler = LLaDA2Sampler(gen_length=24, block_length=BL, steps=BL,
                          threshold=0.6)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 16)]
  ids, valid = left_pad(prompts, config.pad_token_id, room=(
      config.max_seq_len - sampler.gen_length - tail_length(sampler)))
  rng_B = jax.vmap(jax.random.key)(jnp.zeros(len(prompts), jnp.uint32))
  args = (params, jnp.asarray(ids), jnp.asarray(valid), rng_B, None)
  kw = dict(config=config, sampler=sampler, stop_at_eos=True,
            implementation=None, logprobs=False)
  compiled = decode_jit(*args, **kw)
  python = decode_tokens(*args, compiled=False, **kw)
  for a, b in zip(compiled, python, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_options_and_configs_get_one_clear_error(hf, tmp_path):
  with pytest.raises(ValueError, match="threshold must be None or in "
                     r"\[0, 1\], got 1.5"):
    LLaDA2Sampler(threshold=1.5)
  with pytest.raises(ValueError, match="decodes llada2 checkpoints, not "
                     "'llada'"):
    fdj.build_sampler("llada2", "llada", {})
  hf_config = json.loads((hf[0] / "config.json").read_text())
  with pytest.raises(ValueError, match="unsupported LLaDA2 config values: "
                     "use_qkv_bias=True"):
    ModelConfig.from_hf_config({**hf_config, "use_qkv_bias": True},
                               special_ids={"eos_token_id": 1,
                                            "mask_token_id": 2})
  with pytest.raises(ValueError, match="the tokenizer has no mask token"):
    ModelConfig.from_hf_config(hf_config, special_ids={"eos_token_id": 1})


@pytest.mark.skipif(not MINI.is_dir(), reason="no LLaDA2.0-mini reference")
def test_the_mini_config_and_tensor_names():
  """The published LLaDA2.0-mini config reads as the preset, and its 14,813
  tensor names map one-to-one onto the model's parameters (stacked)."""
  special = json.loads((MINI / "special_tokens.json").read_text())
  config = ModelConfig.from_hf_config(MINI / "config.json", special_ids={
      k: special[k] for k in ("eos_token_id", "mask_token_id")})
  assert config == ModelConfig.preset("llada2-mini")
  names = [line.split()[0] for line in
           (MINI / "tensors.txt").read_text().splitlines() if line.strip()]
  assert len(names) == 14813
  table = architectures.get("llada2").name_table()
  assert sorted(names) == sorted(tables.expected_names(table, config))
  shapes = {}
  for line in (MINI / "tensors.txt").read_text().splitlines():
    name, dtype, hf_shape = line.split()
    mapped = tables.resolve(name, table, config)
    assert mapped.expected_shape == tuple(map(int, hf_shape.split(","))), line
    shapes.update(mapped.stored_shapes())
  init = traverse_util.flatten_dict(jax.eval_shape(
      lambda: init_params(config, jax.random.key(0))), sep="/")
  assert shapes == {p: a.shape for p, a in init.items()}
  assert 16.2e9 < config.num_params() < 16.3e9
