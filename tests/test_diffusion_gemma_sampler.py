"""diffusion-gemma against Google's own sampler, on the tiny official
checkpoint (tests/reference/diffusion_gemma/, built from the genuine code;
sampler_tokens.json: `gemma.diffusion.Sampler.sample(prompt, rng=seed)`'s
tokens, tools/diffusion_gemma_sampler_fixtures.py).

That tool's --check-sampler run decodes every stored case with this loop
around the official model and gets every official token. Here the loop
runs the engine's forwards (the fast default, and forward="rows", the
reference), within ~4e-5 of the official logits but not bitwise: on this near-uniform random model the self-conditioning
(rounded to bfloat16 every step) turns such a difference into other
canvases within a few steps, so the official tokens are checked on the
decisive setting ("chained": sharp temperatures, short canvases), and the
chaotic default setting checks that a row in a batch keeps its alone bits.
"""

import json

import jax
import numpy as np
import pytest

from flash_dllm_jax import checkpoint, strategies
from flash_dllm_jax.architectures.diffusion_gemma import sampler as S
from flash_dllm_jax.generate import generate
from tests.paths import ROOT

REF = ROOT / "tests" / "reference" / "diffusion_gemma"
DATA = json.loads((REF / "sampler_tokens.json").read_text())


def _rows(case):
  return [c for c in DATA["cases"] if c["case"] == case]


@pytest.fixture(scope="module")
def tiny():
  params, config, _ = checkpoint.load(REF / "tiny", dtype="float32")
  got = float(sum(np.abs(np.asarray(a, np.float64)).sum()
                  for a in jax.tree.leaves(params)))
  assert got == pytest.approx(DATA["params_fingerprint"], rel=1e-12), (
      "tests/reference/diffusion_gemma/tiny changed: rebuild "
      "sampler_tokens.json with tools/diffusion_gemma_sampler_fixtures.py")
  return params, config


def _decode(tiny, prompts, seeds, settings):
  params, config = tiny
  return generate((params, config, None), [list(p) for p in prompts],
                  strategy="diffusion-gemma", seed=list(seeds), **settings)


@pytest.fixture(scope="module")
def chained(tiny):
  rows = _rows("chained")
  return rows, _decode(tiny, [c["prompt"] for c in rows],
                       [c["seed"] for c in rows], rows[0]["settings"])


def test_rows_in_a_batch_get_the_official_alone_tokens(chained):
  """Prompts of 4, 8 and 12 tokens with two seeds in one batch, several
  canvases each: every row's tokens are the official sampler's for that
  prompt alone."""
  rows, out = chained
  for c, got in zip(rows, out.tokens_BxG):
    assert got.tolist() == c["tokens"], (c["seed"], len(c["prompt"]))


def test_the_chained_rule_stops_canvases_early(chained):
  """The default rule (token stability AND mean entropy <= 0.005) ends
  some canvases before max_denoising_steps: the tokens above come from
  early-stopped canvases, not only from exhausted step budgets."""
  rows, out = chained
  s = rows[0]["settings"]
  assert np.any(out.steps_B % s["max_denoising_steps"] != 0)


def test_a_row_in_a_batch_keeps_its_alone_bits(tiny):
  """The chaotic default setting (3 canvases of 8, longer than the
  window of 4): a batch of prompts of different lengths gives each row
  its batch-of-one tokens, step counts and forwards."""
  rows = [c for c in _rows("defaults") if c["seed"] == 7]
  s = rows[0]["settings"]
  out = _decode(tiny, [c["prompt"] for c in rows], [7] * len(rows), s)
  for i, c in enumerate(rows):
    alone = _decode(tiny, [c["prompt"]], [7], s)
    assert alone.tokens_BxG[0].tolist() == out.tokens_BxG[i].tolist()
    assert alone.steps_B[0] == out.steps_B[i]
    assert alone.forwards_B[0] == out.forwards_B[i]


def test_the_official_batch_is_not_its_alone_answers():
  """Documented difference: the official sampler shares one key, RoPE
  position and cache index across a batch, so its batched rows differ
  from its own alone answers (stored from the genuine code)."""
  b = DATA["official_batch"]
  alone = {tuple(c["prompt"]): c["tokens"] for c in _rows(b["case"])
           if c["seed"] == b["seed"]}
  assert any(got != alone[tuple(p)]
             for p, got in zip(b["prompts"], b["tokens"]))


def test_the_cache_is_written_once_and_reused(tiny, monkeypatch):
  """Every forward runs the prompt (once), one canvas (each step), or a
  finished canvas (its append), never the whole sequence again; a row's
  forwards are its steps + 1 prefill + 1 append per later canvas; an end
  token ends the answer with PAD after it."""
  widths = []
  real = S.FORWARDS["fast"]

  def recording(model, params, config, tokens, *args, **kwargs):
    widths.append(tokens.shape[1])
    return real(model, params, config, tokens, *args, **kwargs)

  monkeypatch.setitem(S.FORWARDS, "fast", recording)
  settings = dict(canvas_length=4, max_denoising_steps=3, early_stop="none",
                  max_out_length=14, stop_tokens=(99,))
  prompt = DATA["cases"][0]["prompt"]
  out = _decode(tiny, [prompt, prompt[:3]], [1, 2], settings)
  assert sorted(set(widths)) == [4, 64]  # canvases; the padded prompt
  canvases = out.steps_B // 3
  assert np.all(out.forwards_B == out.steps_B + 1 + (canvases - 1))
  _, config = tiny
  ends = set(config.stop_token_ids) | {99}
  for row, n in zip(out.tokens_BxG.tolist(), canvases):
    hit = [i for i, t in enumerate(row) if t in ends]
    if hit:
      assert all(t == 0 for t in row[hit[0] + 1:])
      assert n == hit[0] // 4 + 1
    else:
      assert n == 4  # ceil(14 / 4) canvases, the last cut at 14 tokens


def test_bad_options_get_one_clear_error():
  with pytest.raises(ValueError, match="early_stop must be one of"):
    S.DiffusionGemmaSampler(early_stop="entropy:x")
  with pytest.raises(ValueError, match="min_temperature"):
    S.DiffusionGemmaSampler(min_temperature=0.0)
  with pytest.raises(ValueError, match="stop_tokens must be"):
    S.DiffusionGemmaSampler(stop_tokens="a,b")
  s = strategies.build_sampler("diffusion-gemma", "diffusion_gemma",
                               {"stop_tokens": "20, 21",
                                "early_stop": "entropy:0.5"})
  assert s.stop_tokens == (20, 21) and s.tail_length == 0
  with pytest.raises(ValueError, match="decodes diffusion_gemma"):
    strategies.build_sampler("diffusion-gemma", "llada", {})


def test_the_row_by_row_reference_forward_stays_selectable(tiny, chained):
  """forward="rows" (the plain reference, one row at a time) decodes the
  same official tokens as the default fast forward on the decisive
  setting."""
  rows, fast = chained
  out = _decode(tiny, [c["prompt"] for c in rows], [c["seed"] for c in rows],
                {**rows[0]["settings"], "forward": "rows"})
  assert out.tokens_BxG.tolist() == [c["tokens"] for c in rows]
  assert out.tokens_BxG.tolist() == fast.tokens_BxG.tolist()
  with pytest.raises(ValueError, match="forward"):
    S.DiffusionGemmaSampler(forward="dense")
