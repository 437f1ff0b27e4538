"""lm-eval's conventions for the model `flash_dllm_jax` (pretrained=, its
--batch_size forms, output folders named after the checkpoint, one error
for a bad value) and the batched Monte-Carlo likelihood: a request's score
is the same at every batch size and whatever shares its forwards."""

import dataclasses
import re

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.loggers.evaluation_tracker import \
    GeneralConfigTracker  # noqa: E402
from lm_eval.utils import sanitize_model_name  # noqa: E402

from flash_dllm_jax.checkpoint import load  # noqa: E402
from flash_dllm_jax.generate import generate  # noqa: E402
from flash_dllm_jax import likelihood  # noqa: E402
from flash_dllm_jax.prompts import padded_length  # noqa: E402
from flash_dllm_jax.lm_eval import FlashDLLMJax  # noqa: E402
from flash_dllm_jax.lm_eval.__main__ import main, \
    model_args_as_pretrained  # noqa: E402
from flash_dllm_jax.lm_eval.args import AUTO_BATCH_SIZE, ModelArgsError, \
    parse  # noqa: E402
from flash_dllm_jax.lm_eval.model import cut_at_until  # noqa: E402
from flash_dllm_jax.sampling.row_sampling import Sampling  # noqa: E402
from flash_dllm_jax.strategies import build  # noqa: E402
from tests.paths import TINY_CHECKPOINT  # noqa: E402

TINY = str(TINY_CHECKPOINT)
REQUESTS = [("Ruby bakes 6 trays.", " 42"), ("", "So, 7 boxes."),
            ("Tom has " * 5, " 3 apples and 9 pears, " * 4)]


def _instances():
  return [Instance("loglikelihood", {}, args, i)
          for i, args in enumerate(REQUESTS)]


@pytest.mark.parametrize("lm_eval_batch, want", [
    (1, 1), ("8", 8), ("auto", AUTO_BATCH_SIZE), ("auto:4", AUTO_BATCH_SIZE)])
def test_pretrained_and_lm_evals_batch_size_forms(lm_eval_batch, want):
  """What lm-eval's CLI passes: --batch_size as a string, pretrained=."""
  args, _ = parse({"pretrained": TINY, "batch_size": lm_eval_batch,
                   "device": None})
  assert (args.checkpoint, args.batch_size) == (TINY, want)
  capped, _ = parse({"checkpoint": TINY, "batch_size": "auto",
                     "max_batch_size": 4})
  assert capped.batch_size == 4
  # A batch_size inside model_args wins over lm-eval's --batch_size.
  inside, _ = parse({"pretrained": TINY, "batch_size": 2})
  assert inside.batch_size == 2


@pytest.mark.parametrize("model_args, names", [
    ("cfg=nan", ["cfg must be a finite number >= 0, got nan"]),
    ("cfg=inf,seed=-1", ["cfg must be a finite number >= 0, got inf",
                         "seed must be in [0, 2**32), got -1"]),
    ("seed=4294967296,sampling_eps=nan", ["seed must be in [0, 2**32)",
                                          "sampling_eps must be in [0, 1)"]),
    ("mc_num=48", ["mc_num (48) must be a multiple of mc_group (32)"]),
    ("mc_num=8,mc_group=0,batch_size=auto:x", [
        "mc_group must be a positive",
        "batch_size must be a positive int, auto or auto:N, got 'auto:x'"]),
    ("checkpoint=README.md", ["two checkpoints"]),
])
def test_bad_values_are_one_error(model_args, names):
  with pytest.raises(ModelArgsError, match="^bad model_args for "
                     "flash_dllm_jax: ") as err:
    FlashDLLMJax.create_from_arg_string(f"pretrained={TINY},{model_args}",
                                        {"batch_size": "1"})
  for name in names:
    assert name in str(err.value)
  assert str(err.value).count("bad model_args") == 1


def test_a_file_is_not_a_checkpoint():
  with pytest.raises(ModelArgsError, match="checkpoint='README.md' is a "
                     "file, not a directory"):
    parse({"pretrained": "README.md"})


def test_outputs_are_named_after_the_checkpoint():
  """lm-eval names output folders after pretrained= (its own function);
  `python -m flash_dllm_jax.lm_eval` hands checkpoint= over as pretrained=."""
  argv = ["--model", "flash_dllm_jax", "--model_args",
          f"strategy=threshold,checkpoint={TINY}", "seed=1", "--tasks", "t"]
  got = model_args_as_pretrained(argv)
  assert got[3] == f"strategy=threshold,pretrained={TINY}"
  assert got[4:] == argv[4:]
  assert model_args_as_pretrained(["-a", '{"checkpoint": "x"}']) == [
      "-a", '{"pretrained": "x"}']
  from lm_eval._cli.utils import key_val_to_dict
  name = GeneralConfigTracker._get_model_name(key_val_to_dict(got[3]))
  assert sanitize_model_name(name) == TINY.replace("/", "__")


@pytest.mark.slow  # lm-eval's CLI indexes its own task files first
def test_cli_reports_bad_model_args_in_one_line(monkeypatch):
  monkeypatch.setenv("FLASH_DLLM_JAX_CACHE_DIR", "off")
  with pytest.raises(SystemExit, match=r"^error: bad model_args for "
                     r"flash_dllm_jax: cfg must be a finite number >= 0, got "
                     r"inf\. "):
    main(["--model", "flash_dllm_jax", "--model_args",
          f"pretrained={TINY},cfg=inf", "--tasks", "synthetic_gsm",
          "--limit", "1"])


def _requests(config, tokenizer):
  """Three requests over two padded shapes, 4 copies each (groups of 2)."""
  out = []
  for i, (context, continuation) in enumerate(REQUESTS):
    prefix = tokenizer.encode(context) or [config.bos_token_id]
    target = tokenizer.encode(continuation)
    masks, weights = likelihood.draw_masks(np.random.default_rng(i),
                                           len(target), 4, 2, "count")
    out.append(likelihood.Request(prefix, target, masks, weights))
  return out


@pytest.mark.parametrize("cfg", [0.0, 0.5])
def test_batched_estimates_equal_one_copy_per_forward(cfg):
  params, config, tokenizer = load(TINY)
  reqs = _requests(config, tokenizer)
  assert len({padded_length(len(r.prefix) + len(r.target))
              for r in reqs}) == 2
  one, forwards = likelihood.estimate_many(params, config, reqs,
                                           batch_size=1, cfg=cfg)
  # Batches of 3 mix the copies of the two short requests and pad the last.
  mixed, _ = likelihood.estimate_many(params, config, reqs, batch_size=3,
                                      cfg=cfg)
  np.testing.assert_array_equal(mixed, one)
  for i, req in enumerate(reqs):
    alone = likelihood.estimate(params, config, *req, batch_size=3, cfg=cfg)
    assert alone == (one[i], forwards[i])
  assert forwards.tolist() == [4 * (2 if cfg else 1)] * 3
  assert np.isfinite(one).all() and (one < 0).all()


def test_lm_evals_batch_size_does_not_change_scores():
  """Through the adapter: --batch_size 3 (lm-eval's string) against 1, the
  masks drawn per request from the seed in groups of mc_group."""
  small = FlashDLLMJax.create_from_arg_string(
      f"pretrained={TINY},mc_num=4,mc_group=2", {"batch_size": 1})
  batched = FlashDLLMJax.create_from_arg_string(
      f"checkpoint={TINY},mc_num=4,mc_group=2", {"batch_size": "3"})
  assert (small.args.batch_size, batched.args.batch_size) == (1, 3)
  want = small.loglikelihood(_instances(), disable_tqdm=True)
  assert batched.loglikelihood(_instances(), disable_tqdm=True) == want
  masks, weights = small.draw_masks(2, 3)
  counts = masks.sum(1)
  np.testing.assert_allclose(weights, 3 / counts)
  assert batched.scored.forwards == small.scored.forwards == 3 * 4


def test_bad_checkpoints_and_seeds_are_one_model_args_error(tmp_path):
  """An empty pretrained=, a directory that is no checkpoint, and a seed
  lm-eval read as a float (-1.0) are each one ModelArgsError."""
  with pytest.raises(ModelArgsError, match="pretrained= \\(checkpoint=\\) "
                     "is empty"):
    parse({"pretrained": ""})
  with pytest.raises(ModelArgsError, match=f"pretrained='{tmp_path}': "):
    FlashDLLMJax(pretrained=str(tmp_path))
  with pytest.raises(ModelArgsError, match=r"seed must be in \[0, 2\*\*32\), "
                     r"got -1\. "):
    parse({"pretrained": TINY, "seed": -1.0})


@pytest.mark.slow
def test_a_huge_batch_size_is_bounded_by_the_requests():
  """batch_size=10**8 over 2 requests decodes 2 rows (not 12.5 M)."""
  from flash_dllm_jax.lm_eval import task_manager
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args={
          "checkpoint": TINY, "strategy": "threshold", "gen_length": 16,
          "block_length": 16, "batch_size": 10**8},
      tasks=["synthetic_gsm"], limit=2, log_samples=True,
      task_manager=task_manager(include_defaults=False))
  samples = [s for s in results["samples"]["synthetic_gsm"]
             if s["filter"] == "strict-match"]
  assert len(samples) == 2
  assert all(isinstance(s["resps"][0][0], str) for s in samples)


@pytest.mark.slow
def test_temperature_samples_a_strategy_that_draws_per_row():
  """model_args temperature / top_k sample threshold's rows (no such
  fields), as generate(sampling=) does (strategies.build: the CLI's and the
  server's path); greedy rows as in the test above (its program)."""
  from flash_dllm_jax.lm_eval import task_manager
  options = {"gen_length": 16, "block_length": 16, "temperature": 1.5,
             "top_k": 50}
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args={
          "checkpoint": TINY, "strategy": "threshold", "batch_size": 2,
          **options}, tasks=["synthetic_gsm"], limit=2, log_samples=True,
      task_manager=task_manager(include_defaults=False))
  samples = sorted((s for s in results["samples"]["synthetic_gsm"]
                    if s["filter"] == "strict-match"),
                   key=lambda s: s["doc_id"])
  prompts = [s["arguments"][0][0] for s in samples]
  sampler, sampling = build("threshold", "llada", options)
  assert sampling == Sampling(temperature=1.5, top_k=50)
  out, greedy = (generate(load(TINY), prompts, sampler=sampler, seed=[0, 1],
                          sampling=x, chat=False) for x in (sampling, None))
  until = samples[0]["arguments"][0][1]["until"]
  assert [s["resps"][0][0] for s in samples] == [
      cut_at_until(t, until) for t in out.texts]
  assert out.tokens_BxG.tolist() != greedy.tokens_BxG.tolist()
  assert results["config"]["flash_dllm_jax"]["sampling"] == dataclasses.asdict(
      sampling)


@pytest.mark.parametrize("strategy, given, temperature, want", [
    ("llada", {}, 0.7, Sampling(temperature=0.7)),
    ("llada", {}, 0.0, None),  # the sampler's own: no row values
    ("llada", {"temperature": 0.5}, 0.7, None),  # model_args state it
    ("threshold", {"top_k": 50}, 0.7, Sampling(temperature=0.7, top_k=50)),
    ("threshold", {}, None, None),
])
def test_a_requests_temperature_decodes_its_row(strategy, given,
                                                temperature, want):
  """gen_kwargs.row: a request's temperature as its row's, over
  model_args' other draw settings, unless model_args give a temperature
  (tests/test_diffusion_gemma_entry.py: through simple_evaluate)."""
  from flash_dllm_jax.lm_eval import gen_kwargs
  sampler, base = build(strategy, "llada", given)
  assert gen_kwargs.row(sampler, given, base, temperature) == (
      base if want is None else want)


def test_a_requests_temperature_reads_do_sample():
  from flash_dllm_jax.lm_eval.gen_kwargs import temperature_of
  assert temperature_of({"do_sample": False, "temperature": 0.7}, 0) == 0.0
  assert temperature_of({"do_sample": True, "temperature": 0.2}, 0) == 0.2
  assert temperature_of({"until": ["\n"]}, 0) is None
  with pytest.raises(ValueError, match=r"request 3: gen_kwargs temperature "
                     r"must be in \[0, 2\]"):
    temperature_of({"temperature": 3.0}, 3)


def test_batch_sizes_are_bounded_by_the_memory(caplog):
  """memory_gib below one row's estimate: batch_size 3 runs 1 row per
  forward, with one warning line, and scores as batch_size 1 does."""
  from flash_dllm_jax.lm_eval import memory
  config = load(TINY)[1]
  one_row = memory.row_bytes(config, 1) / 2**30  # < any row of the requests
  with pytest.raises(ModelArgsError, match="memory_gib must be a finite "
                     "number > 0, got -1.0"):
    parse({"pretrained": TINY, "memory_gib": -1})
  small = FlashDLLMJax.create_from_arg_string(
      f"pretrained={TINY},mc_num=4,mc_group=2", {"batch_size": 1})
  tight = FlashDLLMJax.create_from_arg_string(
      f"pretrained={TINY},mc_num=4,mc_group=2,memory_gib={one_row!r}",
      {"batch_size": "3"})
  want = small.loglikelihood(_instances(), disable_tqdm=True)
  with caplog.at_level("WARNING", logger=memory.__name__):
    assert tight.loglikelihood(_instances(), disable_tqdm=True) == want
    assert tight.loglikelihood(_instances(), disable_tqdm=True) == want
  lines = [r.getMessage() for r in caplog.records
           if r.name == memory.__name__]
  assert len(lines) == 1 and "\n" not in lines[0], lines
  assert re.search(r"loglikelihood batch_size 3 clipped to 1 rows: about "
                   r"[\d.]+ MiB per row of \d+ positions, [\d.]+ GiB "
                   r"memory_gib$", lines[0]), lines
  # Without memory_gib the budget is the device's (the host's on CPU).
  free, where = memory.free_bytes()
  assert free > 0 and where
  assert small.bound.rows("generate_until", 4, 16) == 4  # fits easily
