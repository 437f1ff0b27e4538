"""Property tests of the samplers' options: any drawn options either give one
ValueError naming a drawn field, or decode to an answer with no mask left;
NaN and infinities are always refused with the field's name and value."""

import argparse
import json
import math
import re

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flash_dllm_jax import generate, load, strategies, strategy_flags
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params
from flash_dllm_jax.sampling import commit_rules
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.strategies import (STRATEGIES, archs_of, build_sampler,
                                      sampler_options)
from tests.entry_case import run_in_one_python
from tests.paths import ROOT, TINY_CHECKPOINT


def _float_fields(name: str) -> list[str]:
  strategy = STRATEGIES[name]
  return [k for k, (typ, _) in sampler_options(strategy.sampler).items()
          if typ is float and strategies.takes(strategy, k)]


def _arch(name: str) -> str:
  return archs_of(STRATEGIES[name])[0]


@st.composite
def any_float_options(draw):
  name = draw(st.sampled_from(sorted(STRATEGIES)))
  fields = _float_fields(name)
  chosen = draw(st.lists(st.sampled_from(fields), unique=True, min_size=1))
  return name, {k: draw(st.floats(allow_nan=True, allow_infinity=True))
                for k in chosen}


@settings(max_examples=300, deadline=None, database=None)
@given(any_float_options())
def test_float_options_are_finite_or_refused_by_name(case):
  name, options = case
  bad = sorted(k for k, v in options.items() if not math.isfinite(v))
  try:
    sampler = build_sampler(name, _arch(name), options)
  except ValueError as e:
    message = str(e)
    for k in bad:  # every non-finite field, with its value
      assert re.search(rf"\b{k} must be a finite number, got "
                       rf"{re.escape(repr(options[k]))}", message), message
    assert any(re.search(rf"\b{k}\b", message) for k in options), message
    return
  assert not bad, (name, options)
  for k, v in options.items():
    assert getattr(sampler, k) == v


def test_every_sampler_checks_every_float_option():
  """Each sampler class refuses NaN, inf and -inf in each of its float
  fields (the strategies' fixed options included)."""
  classes = {s.sampler for s in STRATEGIES.values()}
  assert len(classes) == 13
  for cls in classes:
    floats = [k for k, (typ, _) in sampler_options(cls).items()
              if typ is float]
    assert floats, cls
    for k in floats:
      for v in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match=rf"invalid {cls.__name__} "
                           rf"arguments: "
                           rf"{k} must be a finite number, got {v!r}$"):
          cls(**{k: v})


# Decoding: options from small sets (each distinct sampler compiles once),
# some of them invalid; two prompts of a few lengths (one prompt bucket).
VALUES = {
    "temperature": [0.0, 0.7, math.nan, math.inf],
    "cfg_scale": [0.0, 1.5, -math.inf],
    "threshold": [0.5, 0.9, 1.0, math.nan, 1.5],
    "factor": [1.0, 2.0, math.inf, 0.0],
    "gamma": [0.8, -1.0, 1.0, math.nan],
    "eps": [1e-3, 0.5, math.nan],
    "top_p": [0.9, math.nan, 0.0],
    "alg_temp": [0.5, math.inf],
}
SCHEDULE = {"gen_length": 16, "steps": 8, "block_length": 8, "window": 8,
            "block_m": 4}


@pytest.fixture(scope="module")
def models():
  dream, llada2 = ModelConfig.tiny("dream"), ModelConfig.tiny("llada2")
  return {"llada": load(TINY_CHECKPOINT),
          "dream": (init_params(dream, jax.random.key(3)), dream, None),
          "llada2": (init_params(llada2, jax.random.key(3)), llada2, None)}


@st.composite
def decode_cases(draw):
  # Masked-diffusion strategies (diffusion-gemma's random-token canvases
  # have no mask to run out of: tests/test_diffusion_gemma_sampler.py).
  name = draw(st.sampled_from(sorted(
      n for n in STRATEGIES if _arch(n) in ("llada", "dream", "llada2"))))
  taken = sampler_options(STRATEGIES[name].sampler)
  options = {k: v for k, v in SCHEDULE.items() if k in taken}
  if "rule" in taken:  # the commit rule; `steps` is the fixed rule's schedule
    options["rule"] = draw(st.sampled_from(commit_rules.RULES))
    if options["rule"] != "fixed":
      options.pop("steps", None)
  for k in draw(st.lists(st.sampled_from(
      [k for k in _float_fields(name) if k in VALUES]), unique=True)):
    options[k] = draw(st.sampled_from(VALUES[k]))
  lengths = draw(st.lists(st.sampled_from([3, 17, 29]), min_size=2,
                          max_size=2))
  return name, options, lengths, draw(st.booleans())


@pytest.mark.slow
@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(decode_cases())
def test_options_either_refused_or_decode_to_the_end(models, case):
  name, options, lengths, stop_at_eos = case
  params, config, _ = models[_arch(name)]
  try:
    sampler = build_sampler(name, config.arch, options)
  except ValueError as e:
    assert any(re.search(rf"\b{k}\b", str(e)) for k in options), e
    event("refused")
    return
  event("decoded")
  rng = np.random.default_rng(len(lengths))
  prompts = [rng.integers(0, 300, n).tolist() for n in lengths]
  out = generate(params, prompts, config=config, sampler=sampler,
                 stop_at_eos=stop_at_eos)
  assert out.tokens_BxG.shape == (len(prompts), sampler.gen_length)
  # Masks after a stop token come back as pad: none may be left at all.
  assert not (out.tokens_BxG == config.mask_token_id).any(), (name, options)
  assert (out.steps_B <= sampler.num_steps).all()


ENTRY_POINTS = [
    ["-m", "flash_dllm_jax", "generate", "--temperature", "nan"],
    ["-m", "flash_dllm_jax", "generate", "--cfg-scale=-inf"],
    [str(ROOT / "scripts" / "eval_gsm8k.py"), "--temperature", "inf",
     "--limit", "1"],
    [str(ROOT / "scripts" / "eval_humaneval.py"), "--strategy",
     "fast-dllm-dual", "--threshold", "nan", "--limit", "1"],
]


def test_entry_points_refuse_non_finite_options(tmp_path):
  """Each entry point as `python ARGV` (all in one fresh Python)."""
  cmds = [[*argv, "--checkpoint", str(TINY_CHECKPOINT),
           *(["--prompt", "hi"] if argv[0] == "-m" else
             ["--out-dir", str(tmp_path / "out")])] for argv in ENTRY_POINTS]
  for argv, (code, err) in zip(ENTRY_POINTS, run_in_one_python(cmds)):
    assert code != 0, argv
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid "), lines
    assert re.search(r"(temperature|cfg_scale|threshold) must be a finite "
                     r"number, got (nan|inf|-inf)$", lines[0]), lines
  assert not (tmp_path / "out").exists() or not any(
      (tmp_path / "out").rglob("records*.jsonl"))


# temperature / top_p / top_k: one declaration (draw_settings.py), the same
# verdict from the request fields, Sampling, the samplers and the CLI help.
DRAW_CASES = {"temperature": [0, 0.7, 2, -0.1, 2.01, 1e300],
              "top_p": [1, 0.5, 1e-9, 0, 1.01, -1],
              "top_k": [-1, 0, 5, 2**31 - 1, -2, 2**31]}


@pytest.mark.parametrize("name", sorted(DRAW_CASES))
def test_draw_settings_have_one_range_everywhere(name):
  from flash_dllm_jax.sampling import draw_settings
  from flash_dllm_jax.architectures.dream.sampler import DreamSampler
  from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
  from flash_dllm_jax.sampling.row_sampling import Sampling
  from flash_dllm_jax.serve.body import parse_body
  from flash_dllm_jax.serve.errors import BadRequest
  from flash_dllm_jax.serve.protocol import ChatRequest, CompletionRequest
  setting = draw_settings.SETTINGS[name]

  def accepts(build) -> bool:
    try:
      build()
      return True
    except (ValueError, BadRequest):
      return False

  verdicts = set()
  for value in DRAW_CASES[name]:
    ok = setting.error(value) is None
    verdicts.add(ok)
    body = json.dumps({"model": "m", "prompt": "x", name: value}).encode()
    chat = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "x"}], name: value}).encode()
    got = {"request": accepts(lambda: parse_body(body, CompletionRequest)),
           "chat": accepts(lambda: parse_body(chat, ChatRequest)),
           "Sampling": accepts(lambda: Sampling(**{name: value})),
           "Dream": accepts(lambda: DreamSampler(**{name: value})),
           "LLaDA2": accepts(lambda: LLaDA2Sampler(**{name: value}))}
    assert all(v == ok for v in got.values()), (value, ok, got)
  assert verdicts == {True, False}
  parser = argparse.ArgumentParser()
  strategy_flags.add_option_flags(parser)
  flag = next(a for a in parser._actions if a.dest == name)
  assert flag.help.startswith(setting.spec.meaning), flag.help
  assert setting.range_text() in flag.help, flag.help


def test_every_option_is_declared_once_with_its_meaning():
  """Each field of each registered sampler carries its declaration
  (sampling/options.py); a value out of it is refused by the one check
  with the option, its range and the value in one line."""
  from flash_dllm_jax.sampling import options
  for cls in {s.sampler for s in STRATEGIES.values()}:
    for name, (typ, default, spec) in options.declared(cls).items():
      assert spec is not None and spec.meaning, (cls.__name__, name)
      assert spec.error(name, typ, default) is None, (cls.__name__, name)
      if typ is str and spec.choices:
        with pytest.raises(ValueError, match=rf"^invalid {cls.__name__} "
                           rf"arguments: {name} must be one of "):
          cls(**{name: "no-such-choice"})
  with pytest.raises(ValueError, match=r"^invalid FastDLLMSampler "
                     r"arguments: threshold must be in \(0, 1\], got 1.5; "
                     r"refresh_every must be None or a positive int, got 0$"):
    STRATEGIES["fast-dllm-dual"].sampler(threshold=1.5, refresh_every=0)
  # declared answers once per class (the flags ask it thousands of times),
  # each call a dict of its own: what a caller changes stays its own
  cls = STRATEGIES["flash-dllm"].sampler
  mine = options.declared(cls)
  mine.clear()
  assert options.declared(cls) and options.declared(cls) is not mine


def test_the_old_stop_option_is_refused_with_its_new_name_everywhere():
  """`stop` means stop strings to OpenAI users: Flash-dLLM's rule is
  end_rule, and the old name gets one error naming it in model_args, a
  request's `decoding` and build_sampler (the CLI: tests/test_cli.py)."""
  from flash_dllm_jax.lm_eval import args
  from flash_dllm_jax.serve.errors import BadRequest
  from flash_dllm_jax.serve.protocol import CompletionRequest
  from flash_dllm_jax.serve.variant_choice import pick
  new = "is now end_rule (Flash-dLLM's rule for where the answer ends)"
  with pytest.raises(ValueError, match=re.escape(f"stop {new}")):
    args.parse({"pretrained": str(TINY_CHECKPOINT), "stop": "first"})
  sampler = build_sampler("flash-dllm", "llada", {"end_rule": "first"})
  assert sampler.end_rule == "first"
  req = CompletionRequest(model="m", prompt="x", decoding={"stop": "first"})
  with pytest.raises(BadRequest, match=re.escape(f"decoding.stop {new}")):
    pick(req, [sampler], "flash-dllm")
  with pytest.raises(ValueError, match=re.escape("--stop is now --end-rule")):
    build_sampler("flash-dllm", "llada", {"stop": "first"})


@pytest.mark.parametrize("name,options,message", [
    ("llada", {"top_p": 0.5}, "--top-p do not apply to strategy 'llada'"),
    ("flash-cache", {"gamma": 0.5},
     "--gamma do not apply to strategy 'flash-cache'"),
    ("threshold", {"refresh_every": 2},
     "--refresh-every do not apply to strategy 'threshold'"),
    ("fast-dllm-dual", {"rule": "factor", "threshold": 0.5},
     "--threshold has no effect with strategy 'fast-dllm-dual': threshold "
     "applies only with rule 'threshold', not 'factor'"),
    ("llada2-flash", {"factor": 2.0},
     "--factor has no effect with strategy 'llada2-flash': factor applies "
     "only with rule 'factor', not 'threshold'"),
    ("llada2-flash", {"editing_threshold": 0.9},
     "--editing-threshold do not apply to strategy 'llada2-flash'"),
])
def test_an_option_a_strategy_ignores_is_an_error(name, options, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    build_sampler(name, _arch(name), options)


def test_generate_flags_sample_every_strategy_that_samples():
  """temperature / top_p / top_k: the sampler's field where it has one,
  else every row's Sampling (what the API and the server send)."""
  sampler, rows = strategies.build("flash-dllm", "llada", {
      "temperature": 0.7, "top_k": 5, "gamma": 0.5})
  assert sampler.gamma == 0.5
  assert rows == Sampling(temperature=0.7, top_k=5)
  sampler, rows = strategies.build("llada", "llada", {"temperature": 0.7})
  assert sampler.temperature == 0.7 and rows is None
  # DiffusionGemma: its family's mapping onto the annealing
  # (tests/test_diffusion_gemma_entry.py); top_p / top_k refused
  sampler, rows = strategies.build("diffusion-gemma", "diffusion_gemma",
                                   {"temperature": 0.7})
  assert (sampler.max_temperature, sampler.min_temperature) == (0.7, 0.4)
  assert rows is None
  with pytest.raises(ValueError, match="--top-k: top_k 5: the "
                     "diffusion_gemma family's sampler has no top_k"):
    strategies.build("diffusion-gemma", "diffusion_gemma", {"top_k": 5})
