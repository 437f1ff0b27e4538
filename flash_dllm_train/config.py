"""A training run's settings (TrainConfig) and the optimizer they define:
AdamW with linear warmup and cosine decay."""

from __future__ import annotations

import dataclasses

import jax
import optax

from flash_dllm_train.objective import DEFAULT_EPS


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation and bookkeeping settings of one run."""

  steps: int = 6000
  batch_size: int = 256
  lr: float = 1e-3
  warmup_steps: int = 200
  min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  grad_clip: float = 1.0
  eps: float = DEFAULT_EPS
  seed: int = 0
  log_every: int = 50
  eval_every: int = 250
  ckpt_every: int = 1000
  keep_ckpts: int = 2
  eos_pad: str = "random"  # see data.py
  max_minutes: float | None = None  # stop (and save) after this wall time
  # With max_minutes: time the first warmup steps, then shorten `steps` so
  # the whole cosine schedule fits the time (warmup is unaffected).
  fit_to_time: bool = False
  probe_steps: int = 20
  # Stop this invocation (and save) after this wall time without touching
  # the schedule: a rerun with the same OUT continues it (a fitted schedule
  # included), so one schedule can span several device calls.
  stop_after_minutes: float | None = None
  # Likewise after this many steps of this invocation (tests, and splitting
  # a run at a chosen step).
  stop_after_steps: int | None = None
  # The model's ops implementation (flash_dllm_jax/ops/): None uses the
  # GPU's fused (cuDNN) attention there; 'reference' the plain-JAX one.
  implementation: str | None = None
  # Block-causal architectures: the decode block of the block-diffusion
  # objective (block_objective.py).
  block_length: int = 32
  # MoE: after each step every expert bias moves by this much towards
  # balance (+ for experts below the mean load, - above; the bias only
  # shifts the choice, so no gradient trains it). 0 keeps the biases.
  bias_rate: float = 1e-3

  def __post_init__(self):
    bad = [f"{k}={getattr(self, k)!r}" for k in
           ("steps", "batch_size", "log_every", "eval_every", "ckpt_every")
           if not isinstance(getattr(self, k), int) or getattr(self, k) <= 0]
    if not 0 <= self.warmup_steps < self.steps:
      bad.append(f"warmup_steps={self.warmup_steps} (needs 0 <= it < steps)")
    if self.lr <= 0 or not 0 < self.eps < 1:
      bad.append(f"lr={self.lr}, eps={self.eps} (need lr > 0, 0 < eps < 1)")
    if self.fit_to_time and (self.max_minutes is None
                             or self.probe_steps + 1 >= self.warmup_steps):
      bad.append("fit_to_time needs max_minutes and probe_steps + 1 < "
                 f"warmup_steps (got {self.max_minutes}, {self.probe_steps},"
                 f" {self.warmup_steps})")
    if not isinstance(self.block_length, int) or self.block_length < 1:
      bad.append(f"block_length={self.block_length!r} (needs an int >= 1)")
    if not 0 <= self.bias_rate < 1:
      bad.append(f"bias_rate={self.bias_rate} (needs 0 <= it < 1)")
    if self.stop_after_minutes is not None and self.stop_after_minutes < 0:
      bad.append(f"stop_after_minutes={self.stop_after_minutes} (needs >= 0)")
    if self.stop_after_steps is not None and self.stop_after_steps <= 0:
      bad.append(f"stop_after_steps={self.stop_after_steps} (needs > 0)")
    from pallas_kernels.common import IMPLEMENTATIONS
    if self.implementation not in (None, *IMPLEMENTATIONS):
      bad.append(f"implementation={self.implementation!r} (expected None or "
                 f"one of {IMPLEMENTATIONS})")
    if bad:
      raise ValueError("invalid TrainConfig: " + ", ".join(bad))



def make_schedule(tc: TrainConfig) -> optax.Schedule:
  """Linear warmup from 0 to lr, then cosine decay to lr * min_lr_ratio."""
  return optax.warmup_cosine_decay_schedule(
      0.0, tc.lr, tc.warmup_steps, decay_steps=tc.steps,
      end_value=tc.lr * tc.min_lr_ratio)


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW; weight decay on matrices only (not
  on norm scales)."""
  return optax.chain(
      optax.clip_by_global_norm(tc.grad_clip),
      optax.adamw(make_schedule(tc), b1=tc.b1, b2=tc.b2,
                  weight_decay=tc.weight_decay,
                  mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))
