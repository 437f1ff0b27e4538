"""The mixture-of-experts part of a ModelConfig (its own module so that
architecture folders can build one while the registry loads)."""

from __future__ import annotations

import dataclasses
import math

ROUTER_SCORES = ("sigmoid", "softmax")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """A mixture-of-experts MLP (model/moe.py) in the layers from
  `first_dense_layers` on (the earlier ones keep the dense MLP).

  n_experts routed experts of width `hidden`, `top_k` of them per token,
  chosen within the `topk_groups` best of `n_groups` groups of experts
  (a group scores by the sum of its two best biased scores); `n_shared`
  shared experts (one dense MLP of width n_shared * hidden) run for every
  token. Scores are sigmoid (or softmax) of the float32 router logits; an
  expert bias shifts the choice but not the weights; `norm_topk` divides
  the chosen weights by their sum; `routed_scaling` multiplies them.
  """

  n_experts: int
  top_k: int
  hidden: int
  n_shared: int = 0
  first_dense_layers: int = 0
  n_groups: int = 1
  topk_groups: int = 1
  routed_scaling: float = 1.0
  norm_topk: bool = True
  score: str = "sigmoid"
  expert_bias: bool = True

  def __post_init__(self):
    errors = []
    for name in ("n_experts", "top_k", "hidden", "n_groups", "topk_groups"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        errors.append(f"{name} must be a positive int, got {value!r}")
    for name in ("n_shared", "first_dense_layers"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        errors.append(f"{name} must be an int >= 0, got {value!r}")
    if not errors:
      if self.top_k > self.n_experts:
        errors.append(f"top_k ({self.top_k}) exceeds n_experts "
                      f"({self.n_experts})")
      if self.n_experts % self.n_groups:
        errors.append(f"n_groups ({self.n_groups}) must divide n_experts "
                      f"({self.n_experts})")
      elif self.topk_groups > self.n_groups:
        errors.append(f"topk_groups ({self.topk_groups}) exceeds n_groups "
                      f"({self.n_groups})")
      elif self.topk_groups * (self.n_experts // self.n_groups) < self.top_k:
        errors.append(f"topk_groups={self.topk_groups} groups of "
                      f"{self.n_experts // self.n_groups} experts hold fewer "
                      f"than top_k={self.top_k}")
    if not (isinstance(self.routed_scaling, (int, float))
            and math.isfinite(self.routed_scaling)
            and self.routed_scaling > 0):
      errors.append(f"routed_scaling must be a positive finite number, got "
                    f"{self.routed_scaling!r}")
    if self.score not in ROUTER_SCORES:
      errors.append(f"score must be one of {ROUTER_SCORES}, got "
                    f"{self.score!r}")
    for name in ("norm_topk", "expert_bias"):
      if getattr(self, name) not in (True, False):
        errors.append(f"{name} must be a bool, got {getattr(self, name)!r}")
    if errors:
      raise ValueError("invalid MoEConfig: " + "; ".join(errors))
