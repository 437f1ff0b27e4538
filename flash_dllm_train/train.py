"""The training loop: AdamW with warmup + cosine decay, resumable.

Master params are float32; the forward runs in the model config's compute
dtype (bfloat16 for real runs), logits and the loss in float32. One jitted
train step (the state donated, so params and optimizer state update in
place) on fixed-shape batches: a single compilation. Every `ckpt_every`
steps a training checkpoint is written (see checkpoints.py); a rerun with
the same OUT resumes from the newest one with the same batches and draws it
would have had. OUT/metrics.jsonl logs the losses, OUT/loss.png plots them,
OUT/model is the final model in bfloat16.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct, traverse_util

from flash_dllm_jax.checkpoint import load_config
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.tokenizer import Tokenizer
from flash_dllm_train import checkpoints as ckpt
from flash_dllm_train import run_log
from flash_dllm_train.models import init_train_params, num_params
from flash_dllm_train.balance import balance_experts, expert_imbalance
from flash_dllm_train.data import Batches, EncodedRows, rows_batch
from flash_dllm_train.stream import StreamBatches
from flash_dllm_train.config import TrainConfig, make_optimizer, \
    make_schedule
from flash_dllm_train.objective import loss_fn


def _warm_start(like: dict, given: dict) -> dict:
  """`given` cast to float32 after checking it has `like`'s tree and shapes;
  every mismatch is named in one error."""
  flat_like = traverse_util.flatten_dict(like, sep="/")
  flat_given = traverse_util.flatten_dict(given, sep="/")
  bad = [f"missing {k}" for k in flat_like if k not in flat_given]
  bad += [f"unexpected {k}" for k in flat_given if k not in flat_like]
  bad += [f"{k}: shape {tuple(flat_given[k].shape)}, model wants "
          f"{tuple(v.shape)}" for k, v in flat_like.items()
          if k in flat_given and tuple(flat_given[k].shape) != tuple(v.shape)]
  if bad:
    raise ValueError("warm-start weights do not fit the model: "
                     + "; ".join(bad))
  return traverse_util.unflatten_dict(
      {k: jnp.asarray(flat_given[k], jnp.float32) for k in flat_like},
      sep="/")


class TrainState(struct.PyTreeNode):
  step: jax.Array  # int32 scalar: steps taken
  params: dict
  opt_state: optax.OptState


def _compiled_steps(config: ModelConfig, tc: TrainConfig):
  # Bookkeeping fields do not change the compiled steps.
  return make_steps(config, dataclasses.replace(
      tc, log_every=1, eval_every=1, ckpt_every=1, keep_ckpts=1,
      max_minutes=None, fit_to_time=False, probe_steps=20,
      stop_after_minutes=None, stop_after_steps=None))


def fitted_steps(tc: TrainConfig, step: int, elapsed_s: float,
                 step_s: float, compile_s: float = 0.0) -> int:
  """Total steps that end the run within max_minutes at step_s per step
  (never more than tc.steps, never before the warmup ends); 5% of the time
  is left for logging, evaluation and the checkpoint, and the part of the
  fitted program's compile (compile_s) that the warmup's remaining steps do
  not cover."""
  wait_s = max(0.0, compile_s - max(0, tc.warmup_steps - step) * step_s)
  left = int((0.95 * 60 * tc.max_minutes - elapsed_s - wait_s) / step_s)
  return max(min(tc.steps, step + left), tc.warmup_steps + 1)


def _tree_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                      for x in jax.tree.leaves(tree)))


@functools.lru_cache(maxsize=4)
def make_steps(config: ModelConfig, tc: TrainConfig):
  """(train_step(state, batch, key) -> (state, metrics) with the state
  donated, eval_step(params, batch, key) -> metrics), both jitted, for the
  optimizer `make_optimizer(tc)`. The draws of step s use fold_in(key, s),
  so they do not depend on restarts. Cached: runs with equal settings share
  one compilation."""
  objective = functools.partial(loss_fn, config=config, eps=tc.eps,
                                implementation=tc.implementation,
                                block_length=tc.block_length)
  schedule, optimizer = make_schedule(tc), make_optimizer(tc)

  def train_step(state: TrainState, batch, key):
    rng = jax.random.fold_in(key, state.step)
    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
        state.params, batch, rng)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**metrics, "grad_norm": _tree_norm(grads),
               "lr": schedule(state.step)}
    if "expert_load" in metrics:
      loads = metrics.pop("expert_load")
      params = balance_experts(params, loads, tc.bias_rate)
      metrics["expert_imbalance"] = expert_imbalance(loads)
    return TrainState(state.step + 1, params, opt_state), metrics

  def eval_step(params, batch, key):
    metrics = objective(params, batch, key)[1]
    if "expert_load" in metrics:
      metrics["expert_imbalance"] = expert_imbalance(
          metrics.pop("expert_load"))
    return metrics

  return jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)


def train(config: ModelConfig, tokenizer: Tokenizer | None,
          rows: EncodedRows | StreamBatches, out_dir: str | Path,
          tc: TrainConfig,
          eval_rows: EncodedRows | None = None,
          log: Callable[[str], None] = print, mesh=None,
          init_from: dict | None = None) -> tuple[dict, int]:
  """Trains (or resumes) into `out_dir`; returns (float32 params, step).

  rows: fixed training rows (epochs of permutations, `data.Batches`), or a
  `stream.StreamBatches` of fresh problems (its batch size, seed and EOS
  padding must be tc's).

  init_from: weights to start from instead of a random init (a warm start:
  fresh optimizer state and schedule); ignored when `out_dir` holds a
  checkpoint to resume.

  mesh: a `parallel.parse_mesh` mesh ('data=D'): each batch is split over D
  devices and the parameters and optimizer state are replicated; XLA's SPMD
  partitioner adds the gradient all-reduce. Same batches and draws as one
  device (the draws are sharding-invariant), so the same run up to float
  summation order."""
  from flash_dllm_jax import parallel
  mesh = parallel.parse_mesh(mesh)
  if mesh is not None and (parallel.model_size(mesh) != 1
                           or tc.batch_size % parallel.data_size(mesh)):
    raise ValueError(f"training meshes split the batch only: need model=1 "
                     f"and data dividing batch_size {tc.batch_size}, got "
                     f"{dict(mesh.shape)}")
  if isinstance(rows, StreamBatches) and (
      rows.batch_size, rows.seed, rows.eos_pad) != (
          tc.batch_size, tc.seed, tc.eos_pad):
    raise ValueError(f"the stream's batch size, seed and eos_pad "
                     f"({rows.batch_size}, {rows.seed}, {rows.eos_pad}) "
                     f"differ from the TrainConfig's ({tc.batch_size}, "
                     f"{tc.seed}, {tc.eos_pad})")
  place_batch = (lambda b: b) if mesh is None else (
      lambda b: {k: parallel.shard_rows(mesh, v) for k, v in b.items()})
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  step, found = 0, ckpt.list_checkpoints(out)
  if found and load_config(found[-1][1] / "model") != config:
    raise ValueError(f"{found[-1][1]} was trained with a different model "
                     f"config:\n  saved {load_config(found[-1][1] / 'model')}"
                     f"\n  now   {config}")
  optimizer = make_optimizer(tc)
  params = init_train_params(config, jax.random.key(tc.seed))
  if init_from is not None and not found:
    params = _warm_start(params, init_from)
    log("starting from the given weights (fresh optimizer state)")
  opt_state = optimizer.init(params)
  if found:
    step, params, opt_state, _, saved_tok = ckpt.restore_checkpoint(
        found[-1][1], opt_state)
    if (tokenizer is not None and saved_tok is not None
        and saved_tok.backend.to_str() != tokenizer.backend.to_str()):
      raise ValueError(f"{found[-1][1]} has a different tokenizer; resume "
                       "with the tokenizer saved there")
    log(f"resuming from {found[-1][1]} at step {step}")
    fitted = run_log.fitted_in_log(out, step)
    if tc.fit_to_time and fitted is not None:
      tc = dataclasses.replace(tc, steps=fitted, fit_to_time=False)
      log(f"continuing the schedule fitted to {fitted} steps")
  if step >= tc.steps:
    log(f"already at step {step} >= {tc.steps}: nothing to train")
  train_step, eval_step = _compiled_steps(config, tc)
  state = TrainState(jnp.asarray(step, jnp.int32), params, opt_state)
  if mesh is not None:
    state = parallel.replicate(mesh, state)
  if isinstance(rows, StreamBatches):
    batches, rows = rows, rows.first_rows()
  else:
    batches = Batches(rows, tc.batch_size, tc.seed, tc.eos_pad)
  key, eval_key = jax.random.key(tc.seed + 1), jax.random.key(tc.seed + 2)
  # Fixed rows cut after their first EOS, so these losses measure the
  # solutions rather than the easy EOS padding; their gap is how well
  # training carries over to held-out names and templates.
  eval_batches = {}
  for name, source in (("eval_train", rows), ("eval_test", eval_rows)):
    if source is not None and len(source.tokens_MxN):
      d = parallel.data_size(mesh)  # a whole number of rows per device
      index = np.arange(min(tc.batch_size, len(source.tokens_MxN)) // d * d)
      if not len(index):
        continue
      eval_batches[name] = place_batch(
          rows_batch(source, index, source.min_len_M[index]))
  log_path = out / "metrics.jsonl"
  history = run_log.read_log(log_path, step)
  log_path.write_text("".join(json.dumps(r) + "\n" for r in history))
  log_file = open(log_path, "a")

  def record(row: dict) -> None:
    history.append(row)
    log_file.write(json.dumps(row) + "\n")
    log_file.flush()

  def save(at: int) -> None:
    ckpt.save_checkpoint(out, at, state.params, state.opt_state, config,
                         tokenizer, tc.keep_ckpts)

  start, pending, t_log, step_log = time.time(), [], time.time(), step
  first_step = step
  last_saved, probe_from, ahead = step, None, None
  compiler = concurrent.futures.ThreadPoolExecutor(1)
  while step < tc.steps:
    if ahead is not None and (ahead.done() or step + 1 >= tc.warmup_steps):
      train_step, ahead = ahead.result(), None  # the fitted schedule's
    batch = place_batch(batches(step))
    state, metrics = train_step(state, batch, key)
    pending.append(metrics)
    step += 1
    if tc.fit_to_time and step < tc.warmup_steps:
      if probe_from is None:  # after the first (compiling) step
        jax.block_until_ready(state.step)
        probe_from = (step, time.time())
      elif step - probe_from[0] == tc.probe_steps:
        jax.block_until_ready(state.step)
        step_s = (time.time() - probe_from[1]) / tc.probe_steps
        fitted = fitted_steps(tc, step, time.time() - start, step_s,
                              compile_s=probe_from[1] - start)
        log(f"{1000 * step_s:.1f} ms/step: schedule fitted to {fitted} "
            f"steps (asked {tc.steps}) for --max-minutes {tc.max_minutes}")
        record({"kind": "fit", "step": step, "steps": fitted,
                "ms_per_step": 1000 * step_s,
                "compile_s": probe_from[1] - start})
        tc = dataclasses.replace(tc, steps=fitted, fit_to_time=False)
        # The fitted schedule's program compiles beside the warmup's
        # steps, which the first program takes exactly as it would (the
        # warmup does not depend on the schedule's length); fitted_steps
        # leaves the part of that compile the warmup does not cover.
        fitted_step, eval_step = _compiled_steps(config, tc)
        ahead = compiler.submit(fitted_step.lower(state, batch, key).compile)
    if step % tc.log_every == 0 or step == tc.steps:
      got = jax.device_get(pending)
      mean = {k: float(np.mean([m[k] for m in got])) for k in got[0]}
      now = time.time()
      ms = 1000 * (now - t_log) / (step - step_log)
      record({"kind": "train", "step": step, **mean, "ms_per_step": ms})
      log(f"step {step}/{tc.steps} loss {mean['loss']:.4f} masked_ce "
          f"{mean['masked_ce']:.4f} acc {mean['masked_acc']:.3f} lr "
          f"{mean['lr']:.2e} |g| {mean['grad_norm']:.2f} {ms:.0f} ms/step")
      pending, t_log, step_log = [], now, step
    if step % tc.eval_every == 0 or step == tc.steps:
      for name, batch in eval_batches.items():
        m = jax.device_get(eval_step(state.params, batch, eval_key))
        record({"kind": name, "step": step,
                **{k: float(v) for k, v in m.items()}})
        log(f"  {name} loss {float(m['loss']):.4f} acc "
            f"{float(m['masked_acc']):.3f}")
    elapsed = time.time() - start
    over_time = (tc.max_minutes is not None and not tc.fit_to_time
                 and elapsed > 60 * tc.max_minutes)
    pause = not tc.fit_to_time and step < tc.steps and (
        (tc.stop_after_minutes is not None
         and elapsed > 60 * tc.stop_after_minutes)
        or (tc.stop_after_steps is not None
            and step - first_step >= tc.stop_after_steps))
    if step % tc.ckpt_every == 0 or over_time or pause:
      save(step)
      last_saved = step
    if over_time:
      log(f"stopping at step {step}: over --max-minutes {tc.max_minutes}")
      break
    if pause:
      log(f"pausing at step {step} of {tc.steps} (--stop-after-minutes "
          f"{tc.stop_after_minutes}, --stop-after-steps "
          f"{tc.stop_after_steps}): rerun with the same OUT to continue")
      break
  compiler.shutdown(wait=True)
  if last_saved != step:
    save(step)
  log_file.close()
  run_log.plot_loss(history, out / "loss.png",
            f"{config.n_layers} layers, d_model {config.d_model}, "
            f"{num_params(config) / 1e6:.1f}M params")
  return jax.device_get(state.params), step
