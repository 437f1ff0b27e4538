"""Tables from Hugging Face tensor names to our parameter paths.

Each architecture folder holds its table (architectures/<name>/tensors.py),
a tuple of `Rule`s. A rule maps one HF tensor name, a template in which
`{layer}` stands for the block index and `{expert}` for an expert index,
to a param path of the Flax tree; says how to transform the tensor (torch
Linear weights are [out, in]; our kernels are [in, out]); gives the HF
tensor's expected shape for a ModelConfig; and says which layers have it
(all, the dense-MLP ones or the MoE ones). A rule with `{expert}` fills
one slice of a stacked [X, ...] parameter; a rule with several param paths
splits the HF tensor's rows (`split`: the row counts) into them. Names are
matched in full, so LLaDA's `transformer.ff_out` (the LM head) and
`blocks.N.ff_out` (the MLP down projection) never meet.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Literal

import numpy as np

from flash_dllm_jax.config import ModelConfig

Shape = tuple[int, ...]
LAYERS = ("all", "dense", "moe")


@dataclasses.dataclass(frozen=True)
class Rule:
  hf_name: str  # e.g. "model.layers.{layer}.mlp.up_proj.weight"
  param_path: str | tuple[str, ...]  # e.g. "layers_{layer}/up_proj/kernel"
  transform: Literal["transpose", "identity"]
  hf_shape: Callable[[ModelConfig], Shape]
  layers: str = "all"
  split: Callable[[ModelConfig], tuple[int, ...]] | None = None

  def __post_init__(self):
    if self.layers not in LAYERS:
      raise ValueError(f"{self.hf_name}: layers must be one of {LAYERS}")
    if isinstance(self.param_path, tuple) != (self.split is not None):
      raise ValueError(f"{self.hf_name}: several param paths need a split "
                       "and a split needs several param paths")

  @functools.cached_property
  def pattern(self) -> re.Pattern:
    """The regex over HF names; groups 'layer' and 'expert' capture the
    indices."""
    regex = re.escape(self.hf_name)
    for key in ("layer", "expert"):
      regex = regex.replace(re.escape("{" + key + "}"), fr"(?P<{key}>\d+)")
    return re.compile(regex)

  @property
  def per_layer(self) -> bool:
    return "{layer}" in self.hf_name

  @property
  def per_expert(self) -> bool:
    return "{expert}" in self.hf_name

  def layer_ids(self, config: ModelConfig) -> list[int | None]:
    if not self.per_layer:
      return [None]
    moe = [config.is_moe_layer(i) for i in range(config.n_layers)]
    keep = {"all": lambda m: True, "dense": lambda m: not m,
            "moe": lambda m: m}[self.layers]
    return [i for i, m in enumerate(moe) if keep(m)]

  def expert_ids(self, config: ModelConfig) -> list[int | None]:
    return list(range(config.moe.n_experts)) if self.per_expert else [None]


@dataclasses.dataclass(frozen=True)
class Mapped:
  """One HF tensor resolved against a table and a config: the params it
  fills (several for a split rule; one slice `expert` of a stacked one)."""

  hf_name: str
  param_paths: tuple[str, ...]
  rule: Rule
  expected_shape: Shape
  expert: int | None = None
  n_experts: int | None = None
  split_sizes: tuple[int, ...] = ()

  @property
  def param_path(self) -> str:
    return self.param_paths[0]

  def stored_shapes(self) -> dict[str, Shape]:
    """{param path: its shape in our layout} (a stacked one whole)."""
    shape = self.expected_shape
    if self.rule.transform == "transpose":
      shape = shape[::-1]
    if self.rule.split is None:
      shapes = [shape]
    else:
      axis = -1 if self.rule.transform == "transpose" else 0
      shapes = [tuple(n if d == (axis % len(shape)) else s
                      for d, s in enumerate(shape)) for n in self.split_sizes]
    lead = () if self.expert is None else (self.n_experts,)
    return {p: lead + tuple(s) for p, s in zip(self.param_paths, shapes)}

  def apply(self, hf_array: np.ndarray) -> dict[str, np.ndarray]:
    """{param path: the HF tensor (or its part) in our layout} (for an
    expert rule: that expert's slice)."""
    array = hf_array.T if self.rule.transform == "transpose" else hf_array
    if self.rule.split is None:
      return {self.param_paths[0]: array}
    axis = -1 if self.rule.transform == "transpose" else 0
    cuts = np.cumsum(self.split_sizes)[:-1]
    return dict(zip(self.param_paths, np.split(array, cuts, axis=axis)))


def rules(prefix: str, rows, layers: str = "all") -> tuple[Rule, ...]:
  """Rules of (hf suffix, param path, transform, shape) rows under one HF
  name prefix."""
  return tuple(Rule(prefix + hf, path, transform, shape, layers)
               for hf, path, transform, shape in rows)


def resolve(name: str, table: tuple[Rule, ...],
            config: ModelConfig) -> Mapped | None:
  """The mapping of HF tensor `name`, or None if no rule (or no layer or
  expert of the config) claims it."""
  for rule in table:
    match = rule.pattern.fullmatch(name)
    if match is None:
      continue
    layer = int(match["layer"]) if rule.per_layer else None
    expert = int(match["expert"]) if rule.per_expert else None
    if layer not in rule.layer_ids(config):
      return None
    if rule.per_expert and expert not in rule.expert_ids(config):
      return None
    paths = rule.param_path if isinstance(rule.param_path, tuple) else (
        rule.param_path,)
    return Mapped(name, tuple(p.format(layer=layer) for p in paths), rule,
                  tuple(rule.hf_shape(config)), expert,
                  config.moe.n_experts if rule.per_expert else None,
                  tuple(rule.split(config)) if rule.split else ())
  return None


def expected_names(table: tuple[Rule, ...], config: ModelConfig) -> list[str]:
  """Every HF tensor name a checkpoint of `config` must contain."""
  names = []
  for rule in table:
    for i in rule.layer_ids(config):
      names += [rule.hf_name.format(layer=i, expert=x)
                for x in rule.expert_ids(config)]
  return names


# Shapes of HF tensors ([out, in] for Linear weights).
V_E = lambda c: (c.vocab_size, c.d_model)
E = lambda c: (c.d_model,)
D = lambda c: (c.head_dim,)
Q_E = lambda c: (c.n_heads * c.head_dim, c.d_model)
KV_E = lambda c: (c.n_kv_heads * c.head_dim, c.d_model)
QKV_E = lambda c: ((c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.d_model)
E_Q = lambda c: (c.d_model, c.n_heads * c.head_dim)
F_E = lambda c: (c.mlp_hidden, c.d_model)
E_F = lambda c: (c.d_model, c.mlp_hidden)
Q = lambda c: (c.n_heads * c.head_dim,)
KV = lambda c: (c.n_kv_heads * c.head_dim,)
QKV_SPLIT = lambda c: (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                       c.n_kv_heads * c.head_dim)
# MoE: the router [X, E] and its bias [X]; an expert [M, E] / [E, M]; the
# shared experts as one MLP of width n_shared * M.
X_E = lambda c: (c.moe.n_experts, c.d_model)
X = lambda c: (c.moe.n_experts,)
M_E = lambda c: (c.moe.hidden, c.d_model)
E_M = lambda c: (c.d_model, c.moe.hidden)
S_E = lambda c: (c.moe.n_shared * c.moe.hidden, c.d_model)
E_S = lambda c: (c.d_model, c.moe.n_shared * c.moe.hidden)
