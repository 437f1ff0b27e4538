"""Training runs: an uninterrupted run versus one resumed from its
checkpoint, fitting the schedule to a time budget, data parallelism on a
mesh, warm starts and scripts/train_tiny.py; `flash_dllm_jax.load` +
`generate` on what training wrote.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_jax.model import init_params
from flash_dllm_train import checkpoints as ckpt
from flash_dllm_train.config import TrainConfig
from flash_dllm_train.train import train
from tests.training_setup import setup  # noqa: F401 (a fixture)


def test_checkpoints_load_generate_and_resume(setup, tmp_path, capsys):
  tok, config, rows, problems = setup
  tc = TrainConfig(steps=4, batch_size=4, warmup_steps=1, ckpt_every=2,
                   log_every=2, eval_every=2)
  straight, step = train(config, tok, rows, tmp_path / "a", tc, rows)
  assert step == 4
  assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "a")] == [2, 4]
  assert (tmp_path / "a" / "loss.png").stat().st_size > 0
  # An interrupted run (stopped by the time limit after one step) resumes.
  interrupted = TrainConfig(**{**tc.__dict__, "max_minutes": 0.0})
  _, step = train(config, tok, rows, tmp_path / "b", interrupted)
  assert step == 1
  resumed, step = train(config, tok, rows, tmp_path / "b", tc)
  assert step == 4 and "resuming" in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  with pytest.raises(ValueError, match="different model config"):
    train(config.replace(mlp_hidden=64), tok, rows, tmp_path / "b",
          TrainConfig(**{**tc.__dict__, "steps": 6}))
  # What training wrote loads and generates, as saved and as exported.
  ckpt.export_model(tmp_path / "model", resumed, config, tok)
  for path in (ckpt.checkpoint_dir(tmp_path / "a", 4) / "model",
               tmp_path / "model"):
    model = fdj.load(path)
    assert model[1].vocab_size == 512 and model[2] is not None
    out = fdj.generate(model, [problems[0]["question"]], chat=True,
                       gen_length=16, steps=16, block_length=8)
    assert out.tokens_BxG.shape == (1, 16) and isinstance(out.texts[0], str)
  assert fdj.load(tmp_path / "model")[0]["embed"].dtype == jnp.bfloat16


def test_fit_to_time_shortens_the_schedule_after_warmup_probe(setup, tmp_path):
  from flash_dllm_train.train import fitted_steps
  tc = TrainConfig(steps=1000, warmup_steps=10, max_minutes=1.0,
                   fit_to_time=True, probe_steps=3)
  # 57 s of the minute left for steps of 0.1 s, after 5 s spent: 520 more.
  assert fitted_steps(tc, 20, 5.0, 0.1) == 20 + 520
  assert fitted_steps(tc, 20, 5.0, 1e-4) == 1000  # never more than asked
  assert fitted_steps(tc, 5, 59.0, 1.0) == 11  # never inside the warmup
  # A 10 s compile of the fitted program beside the last 5 warmup steps
  # (0.5 s) leaves 9.5 s of waiting.
  assert fitted_steps(tc, 5, 5.0, 0.1, compile_s=10.0) == 5 + 425
  with pytest.raises(ValueError, match="fit_to_time"):
    TrainConfig(steps=100, warmup_steps=3, probe_steps=5, fit_to_time=True,
                max_minutes=1.0)
  tok, config, rows, _ = setup
  tiny = TrainConfig(steps=10_000, batch_size=4, warmup_steps=8,
                     probe_steps=3, log_every=5, eval_every=5, ckpt_every=50,
                     max_minutes=1e-3, fit_to_time=True)
  _, step = train(config, tok, rows, tmp_path / "fit", tiny)
  # Probed on steps 2-4 (step 1 compiles), fitted to the end of the warmup;
  # the time limit, held off while probing, then stops it at once.
  assert step == 4
  log = [json.loads(line) for line in
         (tmp_path / "fit" / "metrics.jsonl").read_text().splitlines()]
  assert [r["steps"] for r in log if r["kind"] == "fit"] == [9]


def test_a_fitted_schedule_continues_across_invocations(setup, tmp_path,
                                                         capsys, monkeypatch):
  """stop_after_minutes pauses a run (after the fit) and saves it; a rerun
  with the same OUT and the same arguments continues the fitted schedule
  instead of refitting or falling back to `steps`."""
  from flash_dllm_train import train as train_module
  from flash_dllm_train.run_log import scheduled_steps
  fits = iter([9, 12])  # a second fit (a refit on resume) would say 12
  monkeypatch.setattr(train_module, "fitted_steps",
                      lambda *a, **k: next(fits))
  tok, config, rows, _ = setup
  first = TrainConfig(steps=10_000, batch_size=4, warmup_steps=8,
                      probe_steps=3, log_every=5, eval_every=5,
                      ckpt_every=50, max_minutes=10.0, fit_to_time=True,
                      stop_after_minutes=0.0)
  _, step = train(config, tok, rows, tmp_path / "run", first)
  assert step == 4 and "pausing at step 4 of 9" in capsys.readouterr().out
  assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "run")] == [4]
  assert scheduled_steps(tmp_path / "run", first) == 9
  again = dataclasses.replace(first, stop_after_minutes=None)
  _, step = train(config, tok, rows, tmp_path / "run", again)
  out = capsys.readouterr().out
  assert step == 9 and "continuing the schedule fitted to 9 steps" in out
  _, step = train(config, tok, rows, tmp_path / "run", again)
  assert step == 9 and "already at step 9 >= 9" in capsys.readouterr().out
  with pytest.raises(ValueError, match="stop_after_minutes"):
    TrainConfig(stop_after_minutes=-1.0)


def test_a_fitted_run_is_the_run_of_its_fitted_length(setup, tmp_path,
                                                      monkeypatch):
  """The fitted schedule's program compiles beside the warmup (whose steps
  the first program takes as the fitted one would): the run equals one
  asked for the fitted length from the start, bit for bit."""
  from flash_dllm_train import train as train_module
  monkeypatch.setattr(train_module, "fitted_steps", lambda *a, **k: 12)
  tok, config, rows, _ = setup
  fit = TrainConfig(steps=10_000, batch_size=4, warmup_steps=8,
                    probe_steps=3, log_every=4, eval_every=50,
                    ckpt_every=50, max_minutes=10.0, fit_to_time=True)
  fitted, step = train(config, tok, rows, tmp_path / "fit", fit)
  assert step == 12
  straight, _ = train(config, tok, rows, tmp_path / "straight",
                      dataclasses.replace(fit, steps=12, fit_to_time=False))
  for a, b in zip(jax.tree.leaves(fitted), jax.tree.leaves(straight)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


DATA_PARALLEL = r'''
import jax, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
assert len(jax.devices()) == 4
from flash_dllm_jax import compilation
# The test run's compilation cache (tests/conftest.py): the resumed runs
# load what the first data=2 run compiled.
compilation.enable_persistent_cache(compilation.default_cache_dir())
from flash_dllm_jax.config import ModelConfig
from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.tokenizer_builder import build_tokenizer, corpus_texts
from flash_dllm_train.data import encode_problems
from flash_dllm_train.train import TrainConfig, train
problems = [p for p in sg.generate(200, 0) if p["steps"] == 2]
tok, ids = build_tokenizer(corpus_texts(problems), vocab_size=512)
config = ModelConfig.tiny("llada", vocab_size=512, **ids)
rows = encode_problems(problems, tok, 128)
tc = TrainConfig(steps=3, batch_size=8, warmup_steps=1, log_every=1,
                 eval_every=3, ckpt_every=3)
out = {}
for spec in (None, "data=2", "data=4"):
  out[spec], step = train(config, tok, rows, f"{DIR}/{spec}", tc, rows,
                          log=lambda s: None, mesh=spec)
  assert step == 3
for spec in ("data=2", "data=4"):
  for a, b in zip(jax.tree.leaves(out[None]), jax.tree.leaves(out[spec])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
# Paused after each step and resumed on the mesh: the same bits.
import dataclasses
one = dataclasses.replace(tc, stop_after_steps=1)
for want in (1, 2, 3):
  resumed, step = train(config, tok, rows, f"{DIR}/resumed", one, rows,
                        log=lambda s: None, mesh="data=2")
  assert step == want, (step, want)
for a, b in zip(jax.tree.leaves(out["data=2"]), jax.tree.leaves(resumed)):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
for bad in ("model=2", "data=3"):
  try:
    train(config, tok, rows, f"{DIR}/bad", tc, mesh=bad)
  except ValueError as e:
    assert "training meshes split the batch only" in str(e), e
  else:
    raise AssertionError(bad)
print("DP-OK")
'''


def test_data_parallel_training_equals_one_device(tmp_path):
  from tests.mesh_case import run_script
  script = f"DIR = {str(tmp_path)!r}\n" + DATA_PARALLEL
  # Level 0 (QUICK_COMPILE): these 3-step runs' compiles outweigh their
  # steps (24 CPU seconds against 33 at XLA's default level).
  assert "DP-OK" in run_script(script)


def _train_tiny():
  """scripts/train_tiny.py as a module (its main runs in this process)."""
  import importlib.util
  from tests.paths import ROOT
  spec = importlib.util.spec_from_file_location(
      "train_tiny", ROOT / "scripts" / "train_tiny.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  return script


SMOKE = ["--smoke", "--eval-problems", "0"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  """scripts/train_tiny.py --smoke paused after its first step, then the
  same command again: {"out": its directory, "printed": what each run
  printed, "model_after_pause": whether the pause exported a model}. The
  warm-start test below starts from the model it exports."""
  import contextlib
  import io
  script = _train_tiny()
  out = tmp_path_factory.mktemp("tiny") / "run"
  run = {"out": out, "printed": []}
  for extra in (["--stop-after-minutes", "0"], []):
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
      script.main(SMOKE + ["--out", str(out)] + extra)
    run["printed"].append(text.getvalue())
    run.setdefault("model_after_pause", (out / "model").exists())
  return run


def test_train_tiny_script_pauses_and_continues(smoke_run):
  """scripts/train_tiny.py --stop-after-minutes pauses without exporting a
  model; the same command again finishes the run and exports it."""
  paused, finished = smoke_run["printed"]
  assert "paused at step 1 of 6" in paused
  assert not smoke_run["model_after_pause"]
  assert "resuming" in finished and "trained to step 6" in finished
  assert fdj.load(smoke_run["out"] / "model")[1].n_layers == 2


def test_warm_start_begins_at_the_given_weights(setup, tmp_path):
  """init_from replaces the random init (a zero-lr run keeps it exactly);
  weights of another shape get one error naming every mismatch."""
  tok, config, rows, _ = setup
  given = init_params(config, jax.random.key(42), param_dtype="bfloat16")
  frozen = TrainConfig(steps=2, batch_size=4, warmup_steps=1, lr=1e-30,
                       weight_decay=0.0, ckpt_every=2)
  params, step = train(config, tok, rows, tmp_path / "warm", frozen,
                       init_from=given)
  assert step == 2
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(given)):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float32),
                               atol=1e-6)
  other = init_params(config.replace(mlp_hidden=64), jax.random.key(0),
                      param_dtype="float32")
  with pytest.raises(ValueError, match="gate_proj.*shape") as err:
    train(config, tok, rows, tmp_path / "bad", frozen, init_from=other)
  assert "down_proj" in str(err.value)


def test_train_tiny_script_warm_starts_from_a_model_dir(
    smoke_run, tmp_path, capsys, monkeypatch):
  """--init-from trains (and exports) the layout training builds, unfused,
  even where load() would join q/k/v (a GPU)."""
  from flash_dllm_jax.checkpoint import load_config
  from flash_dllm_jax.model import fuse
  script = _train_tiny()
  given = smoke_run["out"] / "model"
  monkeypatch.setattr(fuse, "joins_by_default", lambda: True)
  script.main(SMOKE + ["--out", str(tmp_path / "b"), "--init-from",
                       str(given)])
  assert "starting from the given weights" in capsys.readouterr().out
  config = load_config(tmp_path / "b" / "model")
  assert not config.fused_qkv
  assert config == load_config(given)
  with pytest.raises(SystemExit):
    script.main(SMOKE + ["--out", str(tmp_path / "c"), "--layers", "3",
                         "--init-from", str(given)])
  assert "drop --layers" in capsys.readouterr().err


def test_resume_keeps_the_unfused_projections(setup, tmp_path, monkeypatch):
  """load() joins q/k/v on a GPU; a resumed run must get the layout it
  trains (and saved), so restore_checkpoint asks for it unfused."""
  from flash_dllm_jax.model import fuse
  from flash_dllm_train.config import make_optimizer
  tok, config, _, _ = setup
  params = init_params(config, jax.random.key(0), param_dtype="float32")
  opt_state = make_optimizer(TrainConfig()).init(params)
  ckpt.save_checkpoint(tmp_path, 3, params, opt_state, config, tok, 1)
  monkeypatch.setattr(fuse, "joins_by_default", lambda: True)
  step, got, _, got_config, _ = ckpt.restore_checkpoint(
      ckpt.list_checkpoints(tmp_path)[-1][1], opt_state)
  assert step == 3 and got_config == config
  assert jax.tree.structure(got) == jax.tree.structure(params)
