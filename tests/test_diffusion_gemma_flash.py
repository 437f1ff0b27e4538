"""diffusion-gemma-flash (diffusion_gemma/flash.py) on the tiny official
checkpoint: the compiled loop is the plain restatement
(tests/diffusion_gemma_flash_reference.py) of its rule, gamma > 1 is
diffusion-gemma bit for bit, a row keeps its alone bits under continuous
batching, and the options are checked where every entry point checks them.

The setting is the decisive one of the family's sampler tests (sharp
temperatures, short canvases: the draws do not hinge on last bits) with
entropy_bound 0, so the official step accepts one position and renoises
the other; rows with the default gamma keep that draft instead, rows with
gamma 2 (row data: the same program) renoise it. One step's rule on
moderate logits, where some drafts are kept and some renoised, is checked
against numpy separately.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import checkpoint, strategies
from flash_dllm_jax.architectures.diffusion_gemma import flash
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling import row_options
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests import diffusion_gemma_flash_reference as reference
from tests.diffusion_gemma_case import PROMPTS, SEEDS
from tests.paths import ROOT

SETTINGS = dict(canvas_length=2, max_denoising_steps=8, max_out_length=6,
                entropy_bound=1e-6, max_temperature=0.01,
                min_temperature=0.0025, early_stop="chained")
OFF = 2.0  # a gamma no probability reaches: no draft kept
# Prompts of 12, 4 and 8 tokens, each decoded with the default gamma and
# with OFF.
ROWS = (0, 1, 2)
N = len(ROWS)
PICK = [PROMPTS[i] for i in ROWS]
PICK_SEEDS = [SEEDS[i] for i in ROWS]


@pytest.fixture(scope="module")
def tiny():
  params, config, _ = checkpoint.load(
      ROOT / "tests" / "reference" / "diffusion_gemma" / "tiny",
      dtype="float32")
  return params, config


def _decode(tiny, strategy, prompts, seeds, **kwargs):
  params, config = tiny
  return generate((params, config, None), [list(p) for p in prompts],
                  strategy=strategy, seed=list(seeds), logprobs=True,
                  **SETTINGS, **kwargs)


@pytest.fixture(scope="module")
def flashed(tiny):
  """The N prompts with the default gamma, then with gamma OFF, through 2
  slots (continuous batching)."""
  return _decode(tiny, "diffusion-gemma-flash", PICK * 2,
                 PICK_SEEDS * 2, batch_size=2,
                 sampling=[None] * N + [Sampling(gamma=OFF)] * N)


@pytest.fixture(scope="module")
def official(tiny):
  return _decode(tiny, "diffusion-gemma", PICK, PICK_SEEDS, batch_size=2)


def test_the_compiled_loop_is_the_plain_restatement(tiny, flashed):
  """The default-gamma rows' tokens and denoising passes are the plain
  loop's for the prompt alone, and they keep drafts the bound rejected;
  so are a gamma-OFF row's, which keeps none."""
  params, config = tiny
  kept = 0
  for i in (*range(N), N):
    gamma = 0.9 if i < N else OFF
    tokens, passes, trace = reference.decode(
        params, config, PICK[i % N], PICK_SEEDS[i % N], gamma=gamma,
        **SETTINGS)
    assert flashed.tokens_BxG[i].tolist() == tokens, i
    assert int(flashed.steps_B[i]) == passes, i
    kept += sum(k for k, _ in trace) if i < N else 0
    if i >= N:
      assert all(k == 0 for k, _ in trace) and any(r for _, r in trace)
  assert kept > 0


def test_gamma_above_one_is_the_official_sampler(flashed, official):
  """No draft kept: diffusion-gemma's tokens, passes, forwards and
  log-probabilities bit for bit."""
  assert flashed.tokens_BxG[N:].tolist() == official.tokens_BxG.tolist()
  assert flashed.steps_B[N:].tolist() == official.steps_B.tolist()
  assert flashed.forwards_B[N:].tolist() == official.forwards_B.tolist()
  assert (flashed.logprobs_BxG[N:].tolist()
          == official.logprobs_BxG.tolist())


def test_kept_drafts_finish_canvases_in_fewer_passes(flashed, official):
  """Where the entropy bound holds the official canvas back, kept drafts
  pass the stability check sooner: fewer denoising passes per canvas
  (a row's forwards are its passes, 1 prefill and an append per later
  canvas)."""
  per_canvas = lambda out: np.asarray(out.steps_B[:N], float) / (
      out.forwards_B[:N] - out.steps_B[:N])
  assert per_canvas(flashed).mean() < per_canvas(official).mean()
  assert np.all(per_canvas(flashed) <= per_canvas(official))


def test_a_row_in_a_continuous_batch_keeps_its_alone_bits(tiny, flashed):
  """Decoded alone (a batch of one), a prompt with either gamma gets its
  tokens, passes, forwards and log-probabilities from the batch."""
  for i in (0, N + 1):
    alone = _decode(tiny, "diffusion-gemma-flash", [PICK[i % N]],
                    [PICK_SEEDS[i % N]],
                    sampling=[None if i < N else Sampling(gamma=OFF)])
    assert alone.tokens_BxG[0].tolist() == flashed.tokens_BxG[i].tolist()
    assert alone.steps_B[0] == flashed.steps_B[i]
    assert alone.forwards_B[0] == flashed.forwards_B[i]
    assert (alone.logprobs_BxG[0].tolist()
            == flashed.logprobs_BxG[i].tolist())


def test_one_step_keeps_and_renoises_as_restated():
  """flash.accept on moderate logits (4 rows x 6 positions, per-row
  bounds and gammas): the draws, the entropy bound, the kept drafts and
  the noise, restated in numpy over the same random calls."""
  b, c, v = 4, 6, 11
  shaped = jax.random.normal(jax.random.key(3), (b, c, v)) * jnp.asarray(
      [1.0, 4.0, 8.0, 4.0])[:, None, None]
  keys = jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32))
  bound = jnp.asarray([0.5, 0.0, 2.0, 1.0], jnp.float32)
  gamma = jnp.asarray([0.6, 0.9, 0.75, OFF], jnp.float32)
  got = np.asarray(jax.jit(flash.accept, static_argnums=4)(
      shaped, keys, bound, gamma, v))
  kept = renoised = 0
  for r in range(b):
    ck, nk = jax.random.split(keys[r])
    draws = np.asarray(jax.random.categorical(ck, shaped[r][None]))[0]
    noise = np.asarray(jax.random.randint(nk, (1, c), 0, v))[0]
    logp = np.asarray(jax.nn.log_softmax(shaped[r]))
    probs = np.exp(logp)
    ent = -np.sum(np.where(probs == 0, 0, logp) * probs, -1)
    accepted, total = np.zeros(c, bool), np.float32(0)
    for i in np.argsort(ent, kind="stable"):
      accepted[i] = total <= bound[r]
      total = total + ent[i]
    keep = ~accepted & (probs[np.arange(c), draws] >= gamma[r])
    want = np.where(accepted | keep, draws, noise)
    assert got[r].tolist() == want.tolist(), r
    kept += keep.sum()
    renoised += (~accepted & ~keep).sum()
  assert kept > 0 and renoised > 0


@pytest.mark.parametrize("given, needle", [
    ({"gamma": 0.5}, "gamma must be > 0.5"),
    ({"early_stop": "none"}, "token-stability check"),
    ({"early_stop": "entropy:0.1"}, "token-stability check"),
])
def test_bad_options_get_one_clear_error(given, needle):
  with pytest.raises(ValueError, match=needle):
    strategies.build_sampler("diffusion-gemma-flash", "diffusion_gemma",
                             given)


def test_gamma_is_an_option_and_row_data_of_this_strategy_only():
  """--gamma takes this strategy's meaning in the flags' help; a row's
  gamma (a request's, lm-eval's) is checked as the sampler checks it;
  diffusion-gemma refuses gamma."""
  from flash_dllm_jax.strategy_flags import option_help
  assert "diffusion-gemma-flash" in option_help("gamma")
  sampler = strategies.build_sampler("diffusion-gemma-flash",
                                     "diffusion_gemma", {"gamma": 0.95})
  assert sampler.gamma == 0.95 and "gamma" in row_options.options(sampler)
  assert row_options.values_error(sampler, {"gamma": 0.7}) is None
  assert "gamma must be > 0.5" in row_options.values_error(
      sampler, {"gamma": 0.2})
  assert "token-stability" in row_options.values_error(
      sampler, {"early_stop": "none"})
  with pytest.raises(ValueError, match="do not apply"):
    strategies.build_sampler("diffusion-gemma", "diffusion_gemma",
                             {"gamma": 0.95})
