"""diffusion-gemma with per-row option values (row_sampling.Sampling:
max_temperature, min_temperature, exponent, entropy_bound, max_out_length,
early_stop, stop_tokens), on the tiny official checkpoint: rows with
different values decode in one program, each with the official tokens
(sampler_tokens.json) or its alone tokens, through a static batch and
through continuous batching's slots."""

import dataclasses
import json

import numpy as np
import pytest

from flash_dllm_jax import checkpoint
from flash_dllm_jax.architectures.diffusion_gemma import sampler as S
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests.paths import ROOT

REF = ROOT / "tests" / "reference" / "diffusion_gemma"
DATA = json.loads((REF / "sampler_tokens.json").read_text())
BASE = dict(canvas_length=4, max_denoising_steps=3, max_out_length=12)
ROWS = [None, Sampling(max_out_length=5),
        Sampling(stop_tokens=tuple(range(20, 29)), early_stop="none"),
        Sampling(exponent=0.5, entropy_bound=0.3, early_stop="entropy:2.6",
                 max_temperature=1.5, min_temperature=0.9)]


@pytest.fixture(scope="module")
def tiny():
  params, config, _ = checkpoint.load(REF / "tiny", dtype="float32")
  return params, config, None


@pytest.fixture(scope="module")
def prompts():
  return [c["prompt"] for c in DATA["cases"][:len(ROWS)]]


def _decode(model, prompts, seeds, sampling, **options):
  return generate(model, [list(p) for p in prompts], seed=list(seeds),
                  strategy="diffusion-gemma", sampling=sampling,
                  logprobs=True, **options)


def test_rows_with_other_values_get_the_official_tokens(tiny):
  """A sampler with the "token_stability" settings decodes its own rows
  and the "chained" rows, whose settings (early_stop and temperatures)
  are row values, in one batch: every chained row gets the official
  `Sampler.sample` tokens of its prompt alone with its settings (the
  decisive setting, see test_diffusion_gemma_sampler.py)."""
  chained = [c for c in DATA["cases"] if c["case"] == "chained"]
  other = [c for c in DATA["cases"] if c["case"] == "token_stability"]
  s = chained[0]["settings"]
  values = ("early_stop", "max_temperature", "min_temperature")
  shared = lambda c: {k: v for k, v in c["settings"].items()
                      if k not in values}
  assert shared(chained[0]) == shared(other[0])
  row = Sampling(**{k: s[k] for k in values})
  chained = chained[::2]  # each prompt once
  rows = other[:1] + chained
  out = _decode(tiny, [c["prompt"] for c in rows], [c["seed"] for c in rows],
                [None] + [row] * len(chained), **other[0]["settings"])
  for c, got in zip(chained, out.tokens_BxG[1:]):
    assert got.tolist() == c["tokens"], (c["seed"], len(c["prompt"]))


@pytest.fixture(scope="module")
def batch(tiny, prompts):
  return _decode(tiny, prompts, range(len(ROWS)), ROWS, **BASE)


def test_a_row_keeps_its_alone_answer_with_its_values(tiny, prompts, batch):
  """Each row of a batch whose rows have different values gets the
  tokens, log-probabilities, steps and forwards of its prompt alone with
  its values (one compiled program for the four); a row's max_out_length
  ends its answer there (pad after it)."""
  pad = tiny[1].pad_token_id
  for i, row in enumerate(ROWS):
    alone = _decode(tiny, prompts[i:i + 1], [i], [row], **BASE)
    assert batch.tokens_BxG[i].tolist() == alone.tokens_BxG[0].tolist()
    assert batch.logprobs_BxG[i].tolist() == alone.logprobs_BxG[0].tolist()
    assert batch.steps_B[i] == alone.steps_B[0]
    assert batch.forwards_B[i] == alone.forwards_B[0]
  assert np.all(batch.tokens_BxG[1, 5:] == pad)


def test_row_values_equal_the_sampler_options(tiny, prompts, batch):
  """A row's values decode what a sampler with those options decodes
  (here max_out_length, whose answer is shorter, and the annealing)."""
  for i in (1, 3):
    values = {k: v for k, v in dataclasses.asdict(ROWS[i]).items()
              if k in S.DiffusionGemmaSampler.row_fields and v is not None}
    own = _decode(tiny, prompts[i:i + 1], [i], None, **{**BASE, **values})
    g = own.tokens_BxG.shape[1]
    assert batch.tokens_BxG[i, :g].tolist() == own.tokens_BxG[0].tolist()
    assert batch.steps_B[i] == own.steps_B[0]


def test_slots_load_each_rows_values(tiny, prompts, batch):
  """Continuous batching (2 slots for 4 rows: a slot takes its next row's
  values when the row enters it) gives every row its batch answer."""
  out = _decode(tiny, prompts, range(len(ROWS)), ROWS, batch_size=2, **BASE)
  assert out.tokens_BxG.tolist() == batch.tokens_BxG.tolist()
  assert out.logprobs_BxG.tolist() == batch.logprobs_BxG.tolist()
  assert out.steps_B.tolist() == batch.steps_B.tolist()


@pytest.mark.parametrize("row, needle", [
    (Sampling(max_out_length=13), "sampling\\[0\\].max_out_length: "
     "max_out_length 13 exceeds the sampler's max_out_length 12"),
    (Sampling(max_temperature=0.3),
     r"max_temperature \(0.3\) must be >= min_temperature \(0.4\)"),
    (Sampling(stop_tokens=tuple(range(17))),
     "stop_tokens takes at most 16 ids per row, got 17"),
    (Sampling(temperature=0.5), "does not take a per-row temperature"),
])
def test_bad_row_values_get_one_clear_error(tiny, row, needle):
  with pytest.raises(ValueError, match=needle):
    _decode(tiny, [[2, 9]], [0], [row], **BASE)


def test_a_variant_is_only_for_shape_changing_options():
  """serve --variant: canvas_length / max_denoising_steps make a variant;
  a row's own option (here the temperatures) is refused with the request
  field that sets it."""
  from flash_dllm_jax.serve.cli_variants import build_variants
  from flash_dllm_jax.strategies import build_sampler
  own = build_sampler("diffusion-gemma", "diffusion_gemma", {})
  v, = build_variants("diffusion-gemma", "diffusion_gemma", {}, own,
                      ["canvas_length=128"])
  assert v.canvas_length == 128
  with pytest.raises(ValueError, match=r"max_temperature, min_temperature "
                     r"is a per-request setting \(decoding.max_temperature"):
    build_variants("diffusion-gemma", "diffusion_gemma", {}, own,
                   ["max_temperature=0.5,min_temperature=0.2"])
