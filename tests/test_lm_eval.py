"""The lm-eval model `flash_dllm_jax` under lm-eval's own simple_evaluate
(tiny checkpoint), its Monte-Carlo likelihood against NumPy, and its
model_args errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from flash_dllm_jax.checkpoint import load  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.generate import answer_ids, generate  # noqa: E402
from flash_dllm_jax import likelihood  # noqa: E402
from flash_dllm_jax.lm_eval import FlashDLLMJax, task_manager  # noqa: E402
from flash_dllm_jax.lm_eval.model import cut_at_until, padded_rows  # noqa: E402
from flash_dllm_jax.model.transformer import init_params  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402
from tests import independent_forward  # noqa: E402
from tests.paths import TINY_CHECKPOINT  # noqa: E402

TINY = str(TINY_CHECKPOINT)


def local_tasks(**kwargs):
  """The project's tasks alone: indexing lm-eval's own task files costs
  seconds per call, and these tests use none of them."""
  return task_manager(include_defaults=False, **kwargs)


@pytest.fixture(scope="module")
def tiny_lm():
  return FlashDLLMJax(checkpoint=TINY, batch_size=4, mc_num=8)


@pytest.mark.slow
def test_simple_evaluate_on_a_local_task():
  args = {"checkpoint": TINY, "strategy": "threshold", "gen_length": 32,
          "batch_size": 2}
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args=args, tasks=["synthetic_gsm"],
      task_manager=local_tasks(), limit=3, log_samples=True)
  metrics = results["results"]["synthetic_gsm"]
  assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(
      metrics)
  samples = sorted((s for s in results["samples"]["synthetic_gsm"]
                    if s["filter"] == "strict-match"),
                   key=lambda s: s["doc_id"])
  assert len(samples) == 3
  # The answers are generate's for the same prompts and per-row seeds, in
  # one batch of 3 here against batches of 2 (padded) in the adapter.
  model = load(TINY)
  prompts = [s["arguments"][0][0] for s in samples]
  until = samples[0]["arguments"][0][1]["until"]
  out = generate(model, prompts, sampler=build_sampler(
      "threshold", "llada", {"gen_length": 32}), seed=[0, 1, 2], chat=False)
  want = [cut_at_until(t, until) for t in out.texts]
  got = [s["resps"][0][0] for s in samples]
  assert got == want
  info = results["config"]["flash_dllm_jax"]
  gen = info["throughput"]["generate_until"]
  assert gen["requests"] == 3 and gen["steps"] > 0 and gen["forwards"] > 0
  assert 0 < gen["tokens"] <= 3 * 32
  assert info["samplers_by_max_gen_toks"]["256"]["gen_length"] == 32


def test_gen_length_follows_max_gen_toks(tiny_lm):
  # No gen_length: max_gen_toks rounded up to the block (LLaDA: 32), steps
  # equal to it, and answers cut to max_gen_toks tokens.
  sampler, cut = tiny_lm.sampler_for(40)
  assert (sampler.gen_length, sampler.steps, cut) == (64, 64, 40)
  req = Instance("generate_until", {}, ("2 + 3 =", {"until": ["\n\n"],
                                                    "max_gen_toks": 5}), 0)
  text, = tiny_lm.generate_until([req], disable_tqdm=True)
  sampler, cut = tiny_lm.sampler_for(5)
  assert (sampler.gen_length, cut) == (32, 5)
  model = (tiny_lm.params, tiny_lm.config, tiny_lm.tokenizer)
  gen = generate(model, ["2 + 3 ="], sampler=sampler, seed=0,
                 chat=False).tokens_BxG[0]
  answer = answer_ids(gen, tiny_lm.config)
  assert len(answer) > 5
  assert text == cut_at_until(tiny_lm.tokenizer.decode(answer[:5]), "\n\n")


def test_a_buckets_last_batch_pads_to_one_of_four_sizes():
  assert [padded_rows(n, 16) for n in range(1, 17)] == \
      [2, 2, 4, 4] + [8] * 4 + [16] * 8
  assert [padded_rows(n, 5) for n in range(1, 6)] == [1, 2, 3, 5, 5]
  assert padded_rows(1, 1) == 1
  assert cut_at_until("a\n\nQuestion: b", ["Question:", "\n\n"]) == "a"
  assert cut_at_until("abc", "x") == "abc"


def _numpy_estimate(params, config, prefix, target, masks, weights, cfg):
  """The estimator written out: logits from the test-only forward over the
  noisy copies (no padding), then NumPy cross-entropy and weights."""
  seq = np.array(list(prefix) + list(target))
  n, p, m = len(seq), len(prefix), len(masks)
  noisy = np.repeat(seq[None], m, 0)
  noisy[:, p:][masks] = config.mask_token_id

  def logits(tokens_MxN):
    out = independent_forward.forward(
        params, config, jnp.asarray(tokens_MxN),
        jnp.broadcast_to(jnp.arange(n), (m, n)), jnp.ones((m, n, n), bool),
        jnp.broadcast_to(jnp.arange(n), (m, n)))
    return np.asarray(out, np.float64)

  lg = logits(noisy)
  if cfg > 0:
    un_tokens = noisy.copy()
    un_tokens[:, :p] = config.mask_token_id
    un = logits(un_tokens)
    lg = un + (cfg + 1) * (lg - un)
  lg = lg - lg.max(-1, keepdims=True)
  logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
  shift = config.logits_shift
  total = 0.0
  for row, (mask, w) in enumerate(zip(masks, weights)):
    for j in np.flatnonzero(mask):
      total += -logp[row, p + j - shift, target[j]] * w
  return -total / m


@pytest.mark.parametrize("cfg", [0.0, 0.5])
def test_loglikelihood_matches_numpy(cfg):
  lm = FlashDLLMJax(checkpoint=TINY, batch_size=4, mc_num=8, cfg=cfg)
  reqs = [Instance("loglikelihood", {}, ("Ruby bakes 6 trays.", " 42"), 0),
          Instance("loglikelihood", {}, ("", "So, 7 boxes."), 1)]
  got = lm.loglikelihood(reqs, disable_tqdm=True)
  for i, (req, (value, greedy)) in enumerate(zip(reqs, got)):
    prefix, target = lm._encode_pair(*req.args)
    masks, weights = lm.draw_masks(i, len(target))
    want = _numpy_estimate(lm.params, lm.config, prefix, target, masks,
                           weights, cfg)
    assert greedy is False
    assert value < 0
    np.testing.assert_allclose(value, want, rtol=1e-4)


@pytest.mark.slow
def test_dream_estimate_uses_the_logit_shift():
  config = ModelConfig.tiny("dream")
  params = init_params(config, jax.random.key(0))
  prefix, target = [5, 6, 7, 8, 9], [10, 11, 12]
  rng = np.random.default_rng(0)
  masks, weights = likelihood.draw_masks(rng, 3, 8, 4, "rate", 0.1)
  assert ((weights >= 1) & (weights <= 10 + 1e-9)).all()
  value, forwards = likelihood.estimate(params, config, prefix, target, masks,
                                        weights, batch_size=4)
  want = _numpy_estimate(params, config, prefix, target, masks, weights, 0.0)
  np.testing.assert_allclose(value, want, rtol=1e-4)
  assert forwards == 8


def test_llada_masks_are_stratified():
  rng = np.random.default_rng(3)
  masks, weights = likelihood.draw_masks(rng, 10, 8, 4, "count")
  counts = masks.sum(1)
  assert ((counts >= 1) & (counts <= 10)).all()
  np.testing.assert_allclose(weights, 10 / counts)
  for g in (counts[:4], counts[4:]):  # one k per group, then steps of L/4
    assert set(np.diff(g) % 10) <= {2, 3}
  with pytest.raises(ValueError, match="mask scheme must be one of "
                     "\\('count', 'rate'\\), got 'llada'"):
    likelihood.draw_masks(rng, 10, 8, 4, "llada")


def test_loglikelihood_rolling_is_refused(tiny_lm):
  with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
    tiny_lm.loglikelihood_rolling([])


@pytest.mark.parametrize("model_args, names", [
    ("checkpoint=/nowhere,model=2,batch_size=0",
     ["/nowhere", "'model'", "mesh=data=2;model=2", "batch_size"]),
    (f"checkpoint={TINY},strategy=warp", ["strategy='warp'"]),
    (f"checkpoint={TINY},strategy=llada,threshold=0.9", ["--threshold"]),
    (f"checkpoint={TINY},strategy=flash-cache,temperature=-1",
     ["temperature must be in [0, 2]"]),
    (f"checkpoint={TINY},steps=1.5,mc_num=48", ["steps=1.5",
                                                 "mc_num (48)"]),
])
def test_bad_model_args_give_one_clear_error(model_args, names):
  with pytest.raises(ValueError, match="bad model_args for flash_dllm_jax") \
      as err:
    FlashDLLMJax.create_from_arg_string(model_args, {"batch_size": 1})
  for name in names:
    assert name in str(err.value)


def test_simple_evaluate_reports_bad_model_args():
  with pytest.raises(ValueError, match="unknown model_arg 'treshold'"):
    lm_eval.simple_evaluate(model="flash_dllm_jax",
                            model_args=f"checkpoint={TINY},treshold=0.9",
                            tasks=["synthetic_gsm"], limit=1)


@pytest.mark.slow
def test_cli_writes_throughput_beside_the_results(tmp_path):
  import json
  import subprocess
  import sys
  from tests.paths import ROOT
  # lm-eval's own --batch_size (a string to the model); checkpoint= goes to
  # lm-eval as pretrained=, which it names the output folder after.
  cmd = [sys.executable, "-m", "flash_dllm_jax.lm_eval", "--model",
         "flash_dllm_jax", "--batch_size", "2", "--model_args",
         f"checkpoint={TINY},strategy=threshold,gen_length=32",
         "--tasks", "synthetic_gsm", "--limit", "2", "--output_path",
         str(tmp_path)]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  results, = tmp_path.rglob("results_*.json")
  throughput, = tmp_path.rglob("throughput_*.json")
  assert throughput.parent == results.parent == tmp_path / TINY.replace(
      "/", "__")
  stamp = results.stem.removeprefix("results_")
  assert throughput.stem == f"throughput_{stamp}"
  info = json.loads(throughput.read_text())
  assert info == json.loads(results.read_text())["config"]["flash_dllm_jax"]
  assert info["throughput"]["generate_until"]["requests"] == 2
  assert info["adapter"]["batch_size"] == 2
  assert "synthetic_gsm" in done.stdout


def test_cli_names_a_compile_cache_it_cannot_create(tmp_path, monkeypatch):
  """The CLI's persistent compilation cache ($FLASH_DLLM_JAX_CACHE_DIR) that
  cannot be created is one error line, before lm-eval starts."""
  from flash_dllm_jax.lm_eval.__main__ import main
  blocker = tmp_path / "a-file"
  blocker.write_text("")
  monkeypatch.setenv("FLASH_DLLM_JAX_CACHE_DIR", str(blocker / "cache"))
  with pytest.raises(SystemExit, match=r"^error: cannot create the "
                     r"compilation cache .*a-file/cache"):
    main(["--tasks", "synthetic_gsm"])


@pytest.mark.slow
def test_lm_evals_apply_chat_template_uses_the_checkpoints_template():
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax",
      model_args={"checkpoint": TINY, "strategy": "threshold",
                  "gen_length": 32},
      tasks=["synthetic_gsm"], task_manager=local_tasks(), limit=1,
      apply_chat_template=True, log_samples=True)
  sample = results["samples"]["synthetic_gsm"][0]
  prompt = sample["arguments"][0][0]
  tokenizer = load(TINY)[2]
  want = tokenizer.apply_chat_template(
      [{"role": "user", "content": sample["doc"]["question"]}])
  assert prompt.startswith(tokenizer.special_token("bos_token"))
  assert sample["doc"]["question"] in prompt and prompt.endswith(
      want[-20:])


@pytest.mark.slow
def test_simple_evaluate_runs_a_loglikelihood_task(tmp_path):
  (tmp_path / "utils.py").write_text(
      "from flash_dllm_jax.lm_eval.tasks_data import synthetic_gsm\n")
  (tmp_path / "mc.yaml").write_text(
      "task: synthetic_gsm_choice\n"
      "custom_dataset: !function utils.synthetic_gsm\n"
      "output_type: multiple_choice\n"
      "test_split: test\n"
      "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
      "doc_to_choice: \"{{[answer.split('#### ')[-1], '0']}}\"\n"
      "doc_to_target: 0\n"
      "metric_list:\n  - metric: acc\n")
  args = {"checkpoint": TINY, "batch_size": 2, "mc_num": 4}
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args=args,
      tasks=["synthetic_gsm_choice"], limit=2, log_samples=True,
      task_manager=local_tasks(include_path=str(tmp_path)))
  assert "acc,none" in results["results"]["synthetic_gsm_choice"]
  scored = results["config"]["flash_dllm_jax"]["throughput"]["loglikelihood"]
  assert scored["requests"] == 4 and scored["forwards"] == 4 * 4
  for sample in results["samples"]["synthetic_gsm_choice"]:
    values = [resp[0][0] for resp in sample["resps"]]
    assert len(values) == 2 and all(np.isfinite(v) and v < 0 for v in values)
