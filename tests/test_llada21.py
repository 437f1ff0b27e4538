"""Strategy llada2.1 (LLaDA2.1's generate with token editing) against the
plain-Python restatement of the genuine loop (tests/llada2_reference.py
generate_v21) on a tiny genuine-format checkpoint in float32, with runs
that really edit committed tokens; editing off = llada2; compiled loop =
Python loop, cached = uncached, batch invariance, continuous batching =
alone; the card modes; the entry points (command line, lm-eval, server)."""

import dataclasses
import json

import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_jax import cli
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.architectures.llada2.sampler21 import LLaDA21Sampler
from flash_dllm_jax.architectures.llada2.sampler21 import MODES
from tests import llada2_fixtures, llada2_reference
from tests.paths import ROOT
from tests.serve_case import Server
from tests.test_sampling import (check_compiled_equals_python,
                                 check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 random_prompts, tiny)

BL = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  """The genuine-format fixture in float32 with a sharper head (4x, EOS
  2.5x more), as test_llada2's: thresholds, edits and EOS all happen."""
  path, _, _ = llada2_fixtures.write_llada2(
      tmp_path_factory.mktemp("l21") / "hf", seed=1, n_layers=3)
  params, config, tok = fdj.load(path, dtype="float32")
  head = params["lm_head"] * 4.0
  head = head.at[:, config.eos_token_id].multiply(2.5)
  return {**params, "lm_head": head}, config, tok


PROMPTS = random_prompts(0, [5, 11, 8, 16], vocab=290)
OPTIONS = [dict(threshold=0.5, editing_threshold=0.0, max_post_steps=3),
           dict(threshold=0.6, editing_threshold=0.3, num_to_transfer=2,
                max_post_steps=0, eos_early_stop=True)]


def _answer(tokens, eos_id):
  stop = np.nonzero(tokens == eos_id)[0]
  return tokens[:stop[0] + 1 if len(stop) else None].tolist()


@pytest.mark.parametrize("options", OPTIONS,
                         ids=["full-editing", "top2-no-post-early-stop"])
def test_generate_equals_the_genuine_loop(model, options):
  """Every row of a batch of four prompt lengths gives the restated
  genuine loop's answer and model calls for that prompt alone, and the
  runs edit committed tokens."""
  config = model[1]
  opts = dict(gen_length=24, block_length=BL, **options)
  out = fdj.generate(model, PROMPTS, strategy="llada2.1", chat=False, **opts)
  logits_fn = lambda x: np.asarray(
      fdj.logits(model, x, block_length=BL).logits_BxNxV)
  edits = 0
  for i, prompt in enumerate(PROMPTS):
    ref = llada2_reference.generate_v21(
        logits_fn, prompt, mask_id=config.mask_token_id,
        eos_id=config.eos_token_id, **opts)
    assert _answer(out.tokens_BxG[i], config.eos_token_id) == (
        ref.tokens.tolist()), i
    assert out.forwards_B[i] == ref.calls, i
    edits += ref.edits
  assert edits > 0


def test_editing_off_gives_llada2s_tokens(model):
  """No edits, one mask a step, no post-edit forward and a stop after the
  block with an EOS: the genuine LLaDA2.0 loop with one mask a step
  (steps = block_length), token for token and call for call. Strategy
  llada2 gives that loop's answers and calls on these prompts with these
  options (test_llada2.py, the threshold case), so llada2.1 here gives
  llada2's; the reference runs the logits programs compiled above."""
  config = model[1]
  common = dict(gen_length=24, block_length=BL, threshold=0.6)
  new = fdj.generate(model, PROMPTS, strategy="llada2.1", chat=False,
                     editing_threshold=None, max_post_steps=0,
                     eos_early_stop=True, **common)
  logits_fn = lambda x: np.asarray(
      fdj.logits(model, x, block_length=BL).logits_BxNxV)
  for i, prompt in enumerate(PROMPTS):
    ref = llada2_reference.generate_v20(
        logits_fn, prompt, steps=BL, mask_id=config.mask_token_id,
        eos_id=config.eos_token_id, **common)
    assert _answer(new.tokens_BxG[i], config.eos_token_id) == (
        ref.tokens.tolist()), i
    assert new.forwards_B[i] == ref.calls, i


SAMPLER = LLaDA21Sampler(gen_length=16, block_length=4, threshold=0.6,
                         editing_threshold=0.2, max_post_steps=2)
SAMPLED = dataclasses.replace(SAMPLER, temperature=0.8, top_k=40,
                              eos_early_stop=True)


def test_compiled_loop_equals_the_python_loop():
  check_compiled_equals_python("llada2", SAMPLED, 1.2, 22, [5, 12, 8])


def test_rows_do_not_depend_on_the_batch_and_cached_equals_uncached():
  """Batch invariance (sampled rows), and the batch decoded re-running the
  whole window each step gives the cached decode's tokens, model calls and
  steps."""
  batch = check_rows_do_not_depend_on_the_batch("llada2", SAMPLED, 1.2, 23,
                                                [4, 13, 30])
  config, params = tiny("llada2", eos_boost=1.2)
  window = generate(params, random_prompts(23, [4, 13, 30]), config=config,
                    sampler=dataclasses.replace(SAMPLED, block_cache=False),
                    seed=3)
  np.testing.assert_array_equal(batch.tokens_BxG, window.tokens_BxG)
  np.testing.assert_array_equal(batch.forwards_B, window.forwards_B)
  np.testing.assert_array_equal(batch.steps_B, window.steps_B)


def test_continuous_batching_equals_each_request_alone():
  """Sampled rows with the early stop: the requests alone run the program
  the batch-invariance test above compiled (one row, one bucket)."""
  check_continuous_equals_alone("llada2", SAMPLED, 1.2, [4, 19, 9, 6])


def test_modes_options_and_errors():
  speed = fdj.build_sampler("llada2.1-speed", "llada2", {"gen_length": 64})
  assert (speed.threshold, speed.editing_threshold, speed.max_post_steps,
          speed.block_length, speed.temperature) == (0.5, 0.0, 16, 32, 0.0)
  quality = fdj.build_sampler("llada2.1-quality", "llada2", {})
  assert dataclasses.asdict(quality) | MODES["quality"] == (
      dataclasses.asdict(quality))
  with pytest.raises(ValueError, match="--editing-threshold do not apply "
                     "to strategy 'llada2.1-speed'"):
    fdj.build_sampler("llada2.1-speed", "llada2", {"editing_threshold": 0.3})
  with pytest.raises(ValueError, match="--steps do not apply"):
    fdj.build_sampler("llada2.1", "llada2", {"steps": 8})
  with pytest.raises(ValueError, match="invalid LLaDA21Sampler arguments: "
                     "max_post_steps must be an int >= 0, got -1"):
    LLaDA21Sampler(max_post_steps=-1)
  with pytest.raises(ValueError, match="decodes llada2 checkpoints"):
    fdj.build_sampler("llada2.1", "llada", {})


# Entry points ---------------------------------------------------------------
ENTRY = dict(gen_length=16, block_length=8, threshold=0.5,
             editing_threshold=0.1, max_post_steps=2)
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  root = tmp_path_factory.mktemp("llada21-entry")
  hf, _, _ = llada2_fixtures.write_llada2(root / "hf", seed=4)
  from flash_dllm_jax.convert import convert_checkpoint
  convert_checkpoint(hf, root / "ckpt", dtype="float32", progress=False)
  return root / "ckpt", fdj.load(root / "ckpt")


def _offline(model, prompt, chat):
  out = fdj.generate(model, [prompt], strategy="llada2.1", chat=chat, **ENTRY)
  return answer_ids(out.tokens_BxG[0], model[1])


@pytest.mark.slow
def test_entry_points_equal_offline_generate(converted, capsys, tmp_path):
  """The command line, lm-eval's generate_until and the server (official
  client) give offline generate's answer."""
  path, model = converted
  want = _offline(model, PROMPT, chat=False)
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENTRY.items()]
  code = cli.main(["generate", "--checkpoint", str(path), "--strategy",
                   "llada2.1", *flags, "--no-chat", "--prompt", PROMPT,
                   "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err
  assert json.loads(out.out)["results"][0]["token_ids"] == want

  from lm_eval.api.instance import Instance
  from flash_dllm_jax.lm_eval.model import FlashDLLMJax
  args = ",".join(f"{k}={v}" for k, v in ENTRY.items())
  lm = FlashDLLMJax.create_from_arg_string(
      f"pretrained={path},strategy=llada2.1,{args},batch_size=2")
  [text] = lm.generate_until([Instance(
      "generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": 16}), 0)])
  assert text == model[2].decode(want)

  server = Server(path, "llada2.1", ENTRY, "--batch-size", "2",
                  "--max-prompt-tokens", "96",
                  log_path=tmp_path / "server.log")
  try:
    assert server.wait_ready()["strategy"] == "llada2.1"
    client = server.client()
    name = client.models.list().data[0].id
    got = client.completions.create(model=name, prompt=PROMPT, max_tokens=16)
    assert got.choices[0].token_ids == want
    # streamed: edits of committed tokens never revise text already sent
    chunks = client.completions.create(model=name, prompt=PROMPT,
                                       max_tokens=16, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == \
        got.choices[0].text
  finally:
    server.close()


def test_the_llada21_mini_config_reads_as_the_mini_preset():
  """LLaDA2.1-mini's published config is LLaDA2.0-mini's with a 32768-token
  context; nothing else the reader takes differs."""
  ref = ROOT / "tests" / "reference"
  special = json.loads((ref / "llada2-mini" / "special_tokens.json")
                       .read_text())
  ids = {k: special[k] for k in ("eos_token_id", "mask_token_id")}
  new = ModelConfig.from_hf_config(ref / "llada2.1-mini" / "config.json",
                                   special_ids=ids)
  assert new == ModelConfig.preset("llada2.1-mini") == dataclasses.replace(
      ModelConfig.preset("llada2-mini"), max_seq_len=32768)
