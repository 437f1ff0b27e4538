"""Per-row sampling settings (row_sampling.py, row_draws.py): the top_k /
top_p cut against a NumPy reference, greedy rows equal to
`commit_rules.confidence`, each row's draw independent of the other rows'
settings, LLaDA's and Dream's per-row settings equal to their own options,
and their logprobs against a replay of the commit steps; a row's own
threshold / factor / gamma (row_options.py), with or without its own
temperature / top_k, decodes as the sampler built with it, and one its
sampler has no rule for is an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling import commit_rules
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling.row_sampling import (GREEDY, RowSampling,
                                                  Sampling, _restrict,
                                                  propose_tokens)
from tests.row_sampling_case import (check_rows_equal_own_samplers,
                                     replay_logprobs)
from tests.test_sampling import random_prompts, tiny

MASK = 7


def _logits(seed, b=4, r=3, v=50):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(b, r, v)) * 3,
                     jnp.float32)


def _kept_reference(l_V, top_p, top_k):
  """The kept token ids: top_k largest, then the smallest prefix whose
  renormalised mass reaches top_p (vLLM's order)."""
  order = np.argsort(-l_V, kind="stable")
  k = top_k if top_k > 0 else len(l_V)
  order = order[:k]
  p = np.exp(l_V[order] - l_V[order].max())
  p /= p.sum()
  before = np.cumsum(p) - p
  return set(order[(before < top_p) | (top_p >= 1)].tolist())


@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.5, 0), (0.9, 5),
                                         (1.0, 3), (0.05, 0)])
def test_restrict_keeps_what_the_reference_keeps(top_p, top_k):
  l = _logits(0)
  b = l.shape[0]
  out = np.asarray(_restrict(l, jnp.full((b,), top_p, jnp.float32),
                             jnp.full((b,), top_k, jnp.int32)))
  for i in range(b):
    for j in range(l.shape[1]):
      kept = set(np.flatnonzero(out[i, j] > -1e29).tolist())
      assert kept == _kept_reference(np.asarray(l[i, j]), top_p, top_k)


def test_greedy_rows_equal_confidence_and_rows_are_independent():
  l = _logits(1)
  keys = jax.vmap(jax.random.key)(jnp.arange(4, dtype=jnp.uint32))
  mixed = [GREEDY, Sampling(temperature=0.8), Sampling(1.0, 0.7, 0),
           Sampling(1.5, 1.0, 4)]
  x0, conf, _ = propose_tokens(l, RowSampling.of(mixed), keys, MASK)
  want_x0, want_conf = commit_rules.confidence(l)
  np.testing.assert_array_equal(x0[0], want_x0[0])
  np.testing.assert_array_equal(conf[0], want_conf[0])
  for i, s in enumerate(mixed):  # each row alone, the others greedy
    alone = [GREEDY] * 4
    alone[i] = s
    a_x0, a_conf, _ = propose_tokens(l, RowSampling.of(alone), keys, MASK)
    np.testing.assert_array_equal(a_x0[i], x0[i])
    np.testing.assert_array_equal(a_conf[i], conf[i])
  g_x0, g_conf, _ = propose_tokens(l, None, keys, MASK)
  np.testing.assert_array_equal(g_x0, want_x0)


def test_sampling_draws_from_the_cut_distribution():
  """Many keys: every draw is among the kept tokens, never the mask, and
  draws differ across keys."""
  l = jnp.broadcast_to(_logits(2, b=1, r=1), (256, 1, 50))
  l = l.at[..., MASK].set(10.0)  # the likeliest token: still never drawn
  keys = jax.vmap(jax.random.key)(jnp.arange(256, dtype=jnp.uint32))
  s = RowSampling.of([Sampling(1.0, 0.9, 6)] * 256)
  x0, conf, _ = propose_tokens(l, s, keys, MASK)
  masked = np.asarray(l[0, 0]).copy()
  masked[MASK] = -1e30
  kept = _kept_reference(masked, 0.9, 6)
  drawn = set(np.asarray(x0).ravel().tolist())
  assert drawn <= kept and len(drawn) >= 2 and MASK not in drawn
  assert np.all((np.asarray(conf) > 0) & (np.asarray(conf) <= 1))


def test_invalid_settings_name_every_field():
  with pytest.raises(ValueError, match="temperature.*top_p.*top_k.*factor.*"
                     "gamma"):
    Sampling(temperature=-1, top_p=0, top_k=-2, factor=0, gamma=float("nan"))


def test_generate_refuses_row_settings_a_sampler_does_not_take():
  from flash_dllm_jax import load
  from flash_dllm_jax.generate import generate
  from tests.paths import TINY_CHECKPOINT
  model = load(TINY_CHECKPOINT)
  with pytest.raises(ValueError, match="LLaDASampler does not take a per-row "
                     "top_p"):
    generate(model, [[1, 2]], strategy="llada", gen_length=8, steps=8,
             sampling=Sampling(temperature=0.5, top_p=0.9))
  with pytest.raises(ValueError, match="2 sampling settings for 1 prompts"):
    generate(model, [[1, 2]], strategy="flash-dllm", gen_length=8, block_m=8,
             sampling=[GREEDY, GREEDY])


# (arch, base sampler, each row's settings: None keeps the base's options)
OWN_CASES = [
    ("llada", LLaDASampler(gen_length=16, steps=8, block_length=8),
     [Sampling(temperature=0.7), None, Sampling(temperature=1.3)]),
    ("llada", LLaDASampler(gen_length=16, steps=8, temperature=0.5,
                           logits_eos_inf=True, confidence_eos_eot_inf=True),
     [None, GREEDY, Sampling(temperature=0.9)]),
    ("dream", DreamSampler(gen_length=16, steps=8, alg="maskgit_plus"),
     [Sampling(0.8, 0.9, 5), None, Sampling(0.0, 0.7, 0)]),
    ("dream", DreamSampler(gen_length=16, steps=8, alg="entropy", top_k=20),
     [Sampling(1.0, 1.0, 3), None, GREEDY]),
]


@pytest.mark.parametrize("arch,base,rows", OWN_CASES)
def test_row_settings_decode_as_the_samplers_own_options(arch, base, rows):
  """A row's temperature / top_p / top_k in the batch decodes, token for
  token with the same seed, what the sampler built with them decodes for
  the row alone (LLaDA's Gumbel noise, Dream's filters and confidences);
  a greedy row stays bit-identical to the greedy sampler."""
  config, params = tiny(arch, eos_boost=1.5)
  prompts = random_prompts(4, [5, 12, 9])
  check_rows_equal_own_samplers((params, config, None), base, prompts,
                                [3, 4, 5], rows)


def _full_rows(shift):
  def logits(seq, tokens_BxN):
    n = tokens_BxN.shape[1]
    rows_BxN = jnp.broadcast_to(jnp.maximum(jnp.arange(n) - shift, 0),
                                tokens_BxN.shape)
    return seq.logits(tokens_BxN, rows_BxN)
  return logits


@pytest.mark.parametrize("arch,base,rows,shift", [
    (*OWN_CASES[0], 0), (*OWN_CASES[2], 1)])
def test_logprobs_equal_a_replay_of_the_commit_steps(arch, base, rows, shift):
  """logprobs_BxG: each token's log-probability under the model's softmax
  (before temperature and filters) at the step that committed it."""
  config, params = tiny(arch, eos_boost=1.5)
  model = (params, config, None)
  prompts, seeds = random_prompts(4, [5, 12, 9]), [3, 4, 5]
  full = [base.own_sampling() if r is None else r for r in rows]
  got = generate(model, prompts, sampler=base, seed=seeds, sampling=full,
                 logprobs=True)
  want = replay_logprobs(model, base, prompts, seeds, full, _full_rows(shift))
  np.testing.assert_allclose(got.logprobs_BxG, want, atol=2e-5)
  assert (want < 0).mean() > 0.5


LLADA2_FLASH = {"gen_length": 16, "block_length": 4, "threshold": 0.7,
                "gamma": 0.5}
ROW_CASES = {  # id: (strategy, sampler options, the rows' own options)
    "flash-threshold": ("flash-dllm", {"gen_length": 16, "block_m": 8},
                        {"threshold": 0.6}),
    "flash-gamma": ("flash-dllm", {"gen_length": 16, "block_m": 8},
                    {"gamma": 0.1}),
    "fast-factor": ("fast-dllm-dual", {"gen_length": 16, "block_length": 8,
                                       "rule": "factor"}, {"factor": 4.0}),
    "llada2-flash-threshold-gamma": ("llada2-flash", LLADA2_FLASH,
                                     {"threshold": 0.3, "gamma": 0.05}),
    "llada2-flash-factor": ("llada2-flash", {
        **{k: v for k, v in LLADA2_FLASH.items() if k != "threshold"},
        "rule": "factor", "factor": 1.5}, {"factor": 4.0}),
}
SAMPLED = {"temperature": 0.8, "top_k": 5}  # every row's own draws too
ROW_CASES |= {
    "flash-gamma-sampled": (*ROW_CASES["flash-gamma"], SAMPLED),
    "llada2-flash-sampled": (*ROW_CASES["llada2-flash-threshold-gamma"],
                             SAMPLED),
}


@pytest.mark.parametrize("case", list(ROW_CASES))
def test_row_options_equal_the_samplers_own(case):
  """Rows with their own threshold / factor / gamma decode what a sampler
  built with those values decodes, beside a row keeping the sampler's own,
  and the same among other rows and values (and alone); with every row's
  own temperature / top_k too, against the samplers with those draws."""
  from flash_dllm_jax import load
  from flash_dllm_jax.generate import generate
  from flash_dllm_jax.strategies import build_sampler
  from tests.paths import TINY_CHECKPOINT
  strategy, opts, row, draw = (*ROW_CASES[case], {})[:4]
  if strategy == "llada2-flash":  # a tiny random LLaDA2 with sharp logits
    from flash_dllm_jax.config import ModelConfig
    from flash_dllm_jax.model import init_params
    config = ModelConfig.tiny("llada2")
    model = (init_params(config, jax.random.key(7), head_init_scale=8.0),
             config, None)
  else:
    model = load(TINY_CHECKPOINT)
  arch = model[1].arch
  rows, seeds = [[5, 6, 7, 8], [9, 10, 11, 12, 13], [15, 16, 17]], [1, 2, 3]
  own = build_sampler(strategy, arch, opts)
  theirs = build_sampler(strategy, arch, {**opts, **row})
  drawn = Sampling(**draw)
  want_theirs = generate(model, rows, sampler=theirs, seed=seeds,
                         sampling=drawn)
  want_own = generate(model, rows, sampler=own, seed=seeds, sampling=drawn)
  mine = Sampling(**draw, **row)
  got = generate(model, rows, sampler=own, seed=seeds,
                 sampling=[mine, drawn, mine])
  np.testing.assert_array_equal(got.tokens_BxG[[0, 2]],
                                want_theirs.tokens_BxG[[0, 2]])
  np.testing.assert_array_equal(got.tokens_BxG[1], want_own.tokens_BxG[1])
  for name in ("steps_B", "forwards_B"):
    np.testing.assert_array_equal(getattr(got, name)[[0, 2]],
                                  getattr(want_theirs, name)[[0, 2]])
  assert (want_theirs.steps_B != want_own.steps_B).any()  # a difference
  # the first row among other rows, seeds and values (the sampler's own,
  # stated): the same program, the same tokens
  stated = Sampling(**draw, **{k: getattr(own, k) for k in row})
  moved = generate(model, [rows[2], rows[0], rows[1]], sampler=own,
                   seed=[7, 1, 2], sampling=[GREEDY, mine, stated])
  np.testing.assert_array_equal(moved.tokens_BxG[1], got.tokens_BxG[0])
  np.testing.assert_array_equal(moved.tokens_BxG[2], want_own.tokens_BxG[1])
  if case == "flash-gamma":  # and alone
    alone = generate(model, rows[:1], sampler=own, seed=seeds[:1],
                     sampling=mine)
    np.testing.assert_array_equal(alone.tokens_BxG[0], got.tokens_BxG[0])


@pytest.mark.parametrize("strategy,opts,row,needle", [
    ("flash-dllm", {}, {"factor": 2.0}, "FlashDLLMSampler does not take a "
     "per-row factor"),
    ("fast-dllm-dual", {}, {"factor": 2.0}, "factor applies to rule='factor'"),
    ("flash-cache", {}, {"gamma": 0.5}, "runs without verify"),
    ("flash-dllm", {"rule": "fixed"}, {"gamma": 0.5}, "accepts nothing"),
    ("flash-dllm", {}, {"gamma": 1.5}, r"gamma must be in \(0, 1\]"),
    ("fast-dllm-dual", {"rule": "fixed"}, {"threshold": 0.5},
     "threshold applies to rule='threshold'"),
    ("llada", {}, {"gamma": 0.5}, "LLaDASampler does not take a per-row "
     "gamma"),
])
def test_row_options_the_sampler_cannot_take_are_errors(strategy, opts, row,
                                                        needle):
  from flash_dllm_jax import load
  from flash_dllm_jax.generate import generate
  from tests.paths import TINY_CHECKPOINT
  model = load(TINY_CHECKPOINT)
  size = {"llada": {"steps": 8}, "fast-dllm-dual": {"block_length": 8}}.get(
      strategy, {"block_m": 8})
  with pytest.raises(ValueError, match=needle):
    generate(model, [[1, 2], [3]], strategy=strategy, gen_length=8, **size,
             **opts, sampling=[GREEDY, Sampling(**row)])
