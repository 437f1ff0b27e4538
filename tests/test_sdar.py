"""SDAR: genuine-format loading and conversion, the model against
transformers' Qwen3 under SDAR's block-causal mask, strategy `sdar` against
the plain-Python restatement of generate.py (tests/sdar_reference.py), and
its rows independent of the batch and of continuous batching."""

import gzip
import json

import jax
import numpy as np
import pytest
from flax import traverse_util

import flash_dllm_jax as fdj
from flash_dllm_jax import architectures
from flash_dllm_jax.architectures.sdar.sampler import SDARSampler
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import tables
from flash_dllm_jax.model import init_params
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests import sdar_fixtures, sdar_reference
from tests.paths import ROOT
from tests.test_sampling import check_continuous_equals_alone

REFERENCE = ROOT / "tests" / "reference" / "sdar"
BL = 4


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """(HF directory, its weights, its config.json dict)."""
  return sdar_fixtures.write_sdar(tmp_path_factory.mktemp("sdar") / "hf",
                                  seed=1)


@pytest.fixture(scope="module")
def model(hf):
  return fdj.load(hf[0], dtype="float32")


@pytest.fixture(scope="module")
def oracle(hf):
  return sdar_fixtures.torch_model(hf[1], hf[2])


def test_config_tokens_and_chat_come_from_the_genuine_files(model):
  params, config, tok = model
  assert config.arch == "sdar" and config.moe is None
  assert config.spec.attention.mask == "block_causal"
  assert config.mask_token_id == tok.token_to_id("<|MASK|>")
  assert config.stop_token_ids == (tok.token_to_id("<|endoftext|>"),
                                   tok.token_to_id("<|im_end|>"))
  assert params["layers_0"]["q_norm"]["scale"].shape == (8,)
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("block_length", [None, BL])
def test_forward_matches_transformers_qwen3_under_the_mask(model, oracle,
                                                           block_length):
  sdar_fixtures.check_forward(model, oracle, block_length)


def test_converted_and_8bit_checkpoints(hf, model, tmp_path):
  sdar_fixtures.check_conversions(hf[0], model, tmp_path, BL)


# denoising_steps < block_length only under entropy_bounded (where a block
# may end with masks left): the reference's static / dynamic top-k would
# overwrite committed tokens of the ragged prompts' first blocks there.
CASES = {
    "static": dict(remasking_strategy="low_confidence_static"),
    "dynamic": dict(remasking_strategy="low_confidence_dynamic",
                    confidence_threshold=0.6),
    "entropy": dict(remasking_strategy="entropy_bounded", eb_threshold=1.5,
                    denoising_steps=3),
}


@pytest.mark.parametrize("case", CASES)
def test_generate_equals_the_reference_loop(model, oracle, case):
  """Each row of a batch of four prompt lengths gives the reference's
  canvas (to its first stop id) and denoising forwards for that prompt
  alone."""
  check_generate_equals_the_reference_loop(model, oracle, CASES[case])


def check_generate_equals_the_reference_loop(model, oracle, case: dict):
  """`generate` with strategy sdar on four prompts against
  sdar_reference.generate over the oracle's logits, row by row (shared
  with tests/test_sdar_moe.py)."""
  config = model[1]
  opts = {"gen_length": 16, "block_length": BL, "denoising_steps": BL,
          "temperature": 0.0, **case}
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 14)]
  out = fdj.generate(model, prompts, strategy="sdar", chat=False, **opts)
  logits_fn = lambda x: sdar_fixtures.torch_logits(oracle, x, BL)
  stops = config.stop_token_ids
  calls = 0
  for i, prompt in enumerate(prompts):
    ref = sdar_reference.generate(logits_fn, prompt, config.mask_token_id,
                                  stops, **opts)
    ours = out.tokens_BxG[i]
    # masks a block's steps left read as pad (fill_after_stop), = EOS here
    want = np.where(ref.x == config.mask_token_id, config.pad_token_id,
                    ref.x)
    hit = np.flatnonzero(np.isin(ref.x[:len(ours)], stops))
    end = hit[0] + 1 if len(hit) else len(ours)
    assert ours[:end].tolist() == want[:end].tolist(), i
    assert out.forwards_B[i] == ref.denoise, i
    assert ref.prefill == int(len(prompt) >= BL)
    calls += ref.denoise
  assert calls > 0


def test_flash_verify_drafts_as_the_dynamic_rule(model):
  """llada2-flash on SDAR: with gamma 1 (a verify pass accepts nothing)
  its drafts commit what sdar's dynamic rule with one mask a step at least
  commits (the decode of the reference test above, whose program runs), in
  as many steps; rows with gamma 0.5 accept verified drafts and take
  fewer."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 14)]
  stops = model[1].stop_token_ids
  sdar = fdj.generate(model, prompts, strategy="sdar", chat=False,
                      gen_length=16, block_length=BL, denoising_steps=BL,
                      temperature=0.0, confidence_threshold=0.6)
  rows = [Sampling(gamma=g) for g in (1.0, 0.5) for _ in prompts]
  flash = fdj.generate(model, prompts * 2, strategy="llada2-flash",
                       chat=False, gen_length=16, block_length=BL,
                       threshold=0.6, sampling=rows)
  n, open_rows = len(prompts), 0
  for i in range(n):
    want = sdar.tokens_BxG[i]
    hit = np.flatnonzero(np.isin(want, stops))
    end = hit[0] + 1 if len(hit) else len(want)
    assert flash.tokens_BxG[i][:end].tolist() == want[:end].tolist(), i
    if not len(hit):
      assert flash.steps_B[i] == sdar.forwards_B[i]
      open_rows += 1
  assert open_rows
  assert (flash.forwards_B[:n] > flash.steps_B[:n]).all()  # verify ran
  assert flash.steps_B[n:].sum() < flash.steps_B[:n].sum()


def test_continuous_batching_equals_each_request_alone():
  """Four requests through two slots in one compiled loop (a refilled slot
  runs its window again), entropy-bounded at temperature 0.8: every
  answer, model call count and step count equals that request alone."""
  sampler = SDARSampler(gen_length=8, block_length=BL, temperature=0.8,
                        remasking_strategy="entropy_bounded", eb_threshold=1.0)
  check_continuous_equals_alone("sdar", sampler, 1.2, [4, 19, 9, 6])


def test_bad_options_and_configs_get_one_clear_error(hf):
  with pytest.raises(ValueError, match="remasking_strategy must be one of"):
    SDARSampler(remasking_strategy="low_confidence")
  with pytest.raises(ValueError, match="confidence_threshold must be in "
                     r"\[0, 1\], got 1.5"):
    SDARSampler(confidence_threshold=1.5)
  with pytest.raises(ValueError, match="decodes sdar checkpoints, not "
                     "'llada2'"):
    fdj.build_sampler("sdar", "llada2", {})
  with pytest.raises(ValueError, match="unsupported SDAR config values: "
                     "tie_word_embeddings=True"):
    ModelConfig.from_hf_config({**hf[2], "tie_word_embeddings": True})


@pytest.mark.parametrize("name,preset", [("sdar-4b-chat", "sdar-4b"),
                                         ("sdar-8b-chat", "sdar-8b"),
                                         ("sdar-30b-a3b-chat", "sdar-30b-a3b")])
def test_the_published_configs_and_tensor_names(name, preset):
  """The published configs read as the presets (their EOT from the
  tokenizer; SDAR-30B-A3B's mask token too), and the tensor names of each
  index (399 dense, 18,867 with the experts) map one-to-one onto the
  model's parameters; the bf16 size is two bytes a parameter."""
  here = REFERENCE / name
  special = {}
  if (here / "tokenizer_config.json").exists():
    tok = json.loads((here / "tokenizer_config.json").read_text())
    special["mask_token_id"] = next(
        int(i) for i, t in tok["added_tokens_decoder"].items()
        if t["content"] == tok["mask_token"])
  config = ModelConfig.from_hf_config(here / "config.json",
                                      eot_token_id=151645,
                                      special_ids=special)
  assert config == ModelConfig.preset(preset)
  index_path = here / "model.safetensors.index.json"
  if not index_path.exists():
    index = json.loads(gzip.decompress((here / (index_path.name + ".gz"))
                                       .read_bytes()))
  else:
    index = json.loads(index_path.read_text())
  names = sorted(index["weight_map"])
  table = architectures.get("sdar").name_table()
  assert names == sorted(tables.expected_names(table, config))
  shapes = {}
  for name in names:
    shapes.update(tables.resolve(name, table, config).stored_shapes())
  init = traverse_util.flatten_dict(jax.eval_shape(
      lambda: init_params(config, jax.random.key(0))), sep="/")
  assert shapes == {p: a.shape for p, a in init.items()}
  assert 2 * config.num_params() == index["metadata"]["total_size"]
