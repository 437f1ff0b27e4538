"""The Python API: strategy names or objects, the chat default, message
lists (against transformers' apply_chat_template), batch_size for every
sampler, and errors for bad prompts."""

import json
from pathlib import Path

import numpy as np
import pytest
import transformers

import flash_dllm_jax
from flash_dllm_jax import prompts
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling import Refillable
from flash_dllm_jax.strategies import build_sampler
from flash_dllm_jax.tokenizer import Tokenizer, build_tiny_tokenizer
from tests.paths import TINY_CHECKPOINT
from tests.test_sampling import random_prompts, tiny

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "synthetic-gsm-llada-16m"
REFERENCE = Path("/work/shared/reference")
CHATS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": " Hi\n"},
     {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Count to three."}],
]
SMALL = {"llada": dict(gen_length=16, steps=8, block_length=8),
         "dream": dict(gen_length=16, steps=8)}


@pytest.fixture(scope="module")
def tiny_model():
  return flash_dllm_jax.load(TINY_CHECKPOINT)


def test_strategy_name_object_and_sampler_agree():
  config, params = tiny("llada")
  rows = random_prompts(5, [6, 11])
  opts = dict(gen_length=16, block_length=8, threshold=0.7)
  sampler = build_sampler("fast-dllm-dual", "llada", opts)
  by_name = generate(params, rows, config=config, strategy="fast-dllm-dual",
                     **opts)
  by_object = generate(params, rows, config=config, strategy=sampler)
  by_kwarg = generate(params, rows, config=config, sampler=sampler)
  for out in (by_object, by_kwarg):
    np.testing.assert_array_equal(out.tokens_BxG, by_name.tokens_BxG)
    np.testing.assert_array_equal(out.forwards_B, by_name.forwards_B)


@pytest.mark.parametrize("kwargs,message", [
    (dict(strategy="nope"), "unknown strategy 'nope'; known: "),
    (dict(strategy="dream"), "decodes dream checkpoints, not 'llada'"),
    (dict(strategy="flash-dllm", topp=0.9), "unknown option.*topp.*it takes"),
    (dict(strategy="llada", threshold=0.9), "--threshold do not apply"),
    (dict(strategy="flash-dllm", sampler=build_sampler("llada", "llada", {})),
     "not both"),
])
def test_strategy_errors(kwargs, message):
  config, params = tiny("llada")
  with pytest.raises(ValueError, match=message):
    generate(params, [1, 2], config=config, **kwargs)


def test_chat_default_follows_the_template(tiny_model):
  """chat=None (the default) renders a string with the template when the
  tokenizer has one, as the CLI does; chat=False leaves it raw."""
  _, _, tok = tiny_model
  q = "What is 2 plus 3?"
  templated = tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": q}], add_generation_prompt=True))
  assert prompts.token_rows(q, tok, None) == [templated]
  assert prompts.token_rows(q, tok, False) == [tok.encode(q)]
  bare = Tokenizer(tok.backend, {k: v for k, v in tok.config.items()
                                 if k != "chat_template"})
  assert prompts.token_rows(q, bare, None) == [tok.encode(q)]
  with pytest.raises(ValueError, match="prompt 0 is a chat.*no chat template"):
    prompts.token_rows(CHATS[0], bare, None)
  default = generate(tiny_model, q, **SMALL["llada"])
  chat = generate(tiny_model, q, chat=True, **SMALL["llada"])
  np.testing.assert_array_equal(default.tokens_BxG, chat.tokens_BxG)


def _transformers_tokenizer(arch, tmp_path):
  """Our tokenizer and transformers' for the same files, with the genuine
  checkpoint's chat template (the shipped tokenizer for LLaDA; Dream's from
  the reference tokenizer_config.json on a tiny Dream vocabulary)."""
  if arch == "llada":
    path = SHIPPED
  else:
    tok, _ = build_tiny_tokenizer("dream")
    genuine = REFERENCE / "dream-v0-instruct-7b" / "tokenizer_config.json"
    if genuine.is_file():
      tok.config["chat_template"] = json.loads(genuine.read_text())[
          "chat_template"]
    tok.save(tmp_path)
    path = tmp_path
  return (Tokenizer.from_dir(path),
          transformers.PreTrainedTokenizerFast.from_pretrained(path))


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_chats_render_as_transformers_does(arch, tmp_path):
  ours, theirs = _transformers_tokenizer(arch, tmp_path)
  rows = prompts.token_rows(CHATS, ours, None)
  for chat, row in zip(CHATS, rows):
    assert row == theirs.apply_chat_template(chat, add_generation_prompt=True,
                                             tokenize=True)
  # One conversation alone is one prompt, not a batch of messages.
  assert prompts.token_rows(CHATS[1], ours, None) == [rows[1]]
  assert prompts.token_rows(CHATS[1], ours, False) == [rows[1]]


def test_generate_takes_chats_and_strings_in_one_batch(tiny_model):
  _, _, tok = tiny_model
  batch = [CHATS[1], "Name a colour."]
  out = generate(tiny_model, batch, **SMALL["llada"])
  ids = [tok.encode(tok.apply_chat_template(c)) for c in
         (CHATS[1], CHATS[0])]
  again = generate(tiny_model, ids, **SMALL["llada"])
  np.testing.assert_array_equal(out.tokens_BxG, again.tokens_BxG)
  assert len(out.texts) == 2


def test_kernels_reach_every_attention_call():
  """kernels=: the decode loop's attention calls take its tiling (the
  CLI's --attention-split-target); anything but an ops.Kernels is refused."""
  from flash_dllm_jax import ops
  from pallas_kernels.attention import api as attention_api
  seen, real = [], attention_api.split_tiles_for

  def recording(*args, tiling, **kwargs):
    seen.append(tiling.split_target)
    return real(*args, tiling=tiling, **kwargs)

  config, params = tiny("llada", eos_boost=1.5)
  sampler = build_sampler("flash-cache", "llada", {"gen_length": 8,
                                                   "block_m": 4})
  kernels = ops.Kernels(name="pallas_interpret",
                        attention=ops.Tiling(split_target=7))
  attention_api.split_tiles_for = recording
  try:
    out = generate(params, random_prompts(9, [5, 12]), config=config,
                   sampler=sampler, kernels=kernels)
  finally:
    attention_api.split_tiles_for = real
  assert seen and set(seen) == {7}
  assert not (out.tokens_BxG == config.mask_token_id).any()
  with pytest.raises(TypeError, match="kernels must be a flash_dllm_jax.ops"
                     ".Kernels or None, got str"):
    generate(params, [[1, 2]], config=config, sampler=sampler,
             kernels="pallas")


@pytest.mark.parametrize("prompt,message", [
    ([{"role": "user"}], "prompt 0, message 0: 'content' must be a string"),
    ([[{"role": "user", "content": "hi"}, "x"]], "prompt 0: prompt must be"),
    (["fine", "bad \udcff byte"], "prompt 1 is not valid UTF-8: byte 0xff"),
    (["\ud800"], "prompt 0 is not valid UTF-8: '\\\\ud800' is a lone surrogate"),
    ([[{"role": "user", "content": "\udcc3("}]],
     r"prompt 0, message 0 is not valid UTF-8.*b'\\xc3\('"),
    ([{"role": "user", "content": 3}], "'content' must be a string"),
])
def test_bad_prompt_forms(tiny_model, prompt, message):
  with pytest.raises((ValueError, TypeError), match=message):
    generate(tiny_model, prompt, **SMALL["llada"])


# One strategy per batching path of generate(batch_size=): fixed chunks
# (LLaDA's sampler) and continuous batching (Flash-dLLM with verify and the
# confident window: the most per-row state a refill resets). Whether a
# sampler's rows depend on the batch is each sampler's own test
# (tests/test_sampling.py, test_fast_dllm.py, test_flash_dllm.py,
# test_elastic_cache.py: rows alone, in a batch and among other rows), as
# is continuous batching of every Refillable sampler against each request
# alone (test_flash_dllm.py, test_elastic_cache.py).
BATCHING = ["llada", "flash-dllm-confident"]


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[] if n == "llada" else pytest.mark.slow)
    for n in BATCHING])
def test_batch_size_equals_one_batch_for_each_sampler(name):
  """Fixed chunks (samplers that are not Refillable) or continuous batching
  give each row what one batch of all prompts gives it."""
  arch = "dream" if name == "dream" else "llada"
  config, params = tiny(arch, eos_boost=1.5)
  opts = {"gen_length": 16} | ({"steps": 8} if name in ("llada", "dream")
                               else {}) | (
      {"block_length": 8} if name != "dream" else {})
  if name.startswith(("flash", "elastic")):
    opts.pop("block_length")
  sampler = build_sampler(name, arch, opts)
  rows = random_prompts(9, [5, 12, 7, 3, 9])
  seeds = [3, 1, 4, 1, 5]
  whole = generate(params, rows, config=config, sampler=sampler, seed=seeds)
  seen = []
  chunked = generate(params, rows, config=config, sampler=sampler, seed=seeds,
                     batch_size=2, progress=lambda rows, n: seen.append((list(rows), n)))
  np.testing.assert_array_equal(chunked.tokens_BxG, whole.tokens_BxG)
  np.testing.assert_array_equal(chunked.forwards_B, whole.forwards_B)
  np.testing.assert_array_equal(chunked.steps_B, whole.steps_B)
  assert sorted(sum((r for r, _ in seen), [])) == [0, 1, 2, 3, 4]
  assert all(n == 5 for _, n in seen)
  if not isinstance(sampler, Refillable):
    assert [len(r) for r, _ in seen] == [2, 2, 1]


@pytest.mark.slow
def test_shipped_model_answers_a_plain_string():
  """generate(model, question) with every default but the length gives the
  worked solution (the chat template is applied by default)."""
  model = flash_dllm_jax.load(SHIPPED)
  q = ("Ruby bakes 6 trays of rolls with 7 on each tray. She eats 7 of them "
       "and gives 3 to Henry. She packs the rest into boxes of 4. How many "
       "boxes does she fill?")
  out = generate(model, q, strategy="flash-dllm", gen_length=192)
  assert out.texts[0].strip().endswith("#### 8"), out.texts[0]
  for step in ("<<6*7=42>>", "<<42-7=35>>", "<<35-3=32>>", "<<32/4=8>>"):
    assert step in out.texts[0], out.texts[0]
