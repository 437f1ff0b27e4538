"""Per-architecture tables from Hugging Face tensor names to our param paths.

Each `Rule` maps one HF tensor name (a template in which `{layer}` stands for
the block index) to a param path of the Flax tree, says how to transform the
tensor (torch Linear weights are [out, in]; our kernels are [in, out]) and
gives the HF tensor's expected shape for a ModelConfig. Names are matched in
full, so LLaDA's `transformer.ff_out` (the LM head) and `blocks.N.ff_out` (the
MLP down projection) never meet.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Literal

from flash_dllm_jax.config import ModelConfig

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Rule:
  hf_name: str  # e.g. "model.layers.{layer}.mlp.up_proj.weight"
  param_path: str  # e.g. "layers_{layer}/up_proj/kernel"
  transform: Literal["transpose", "identity"]
  hf_shape: Callable[[ModelConfig], Shape]

  @functools.cached_property
  def pattern(self) -> re.Pattern:
    """The regex over HF names; group 'layer' captures the block index."""
    return re.compile(re.escape(self.hf_name).replace(
        re.escape("{layer}"), r"(?P<layer>\d+)"))

  @property
  def per_layer(self) -> bool:
    return "{layer}" in self.hf_name

  def apply(self, hf_array):
    """The HF tensor in our layout."""
    return hf_array.T if self.transform == "transpose" else hf_array


# Shapes of HF tensors ([out, in] for Linear weights).
_V_E = lambda c: (c.vocab_size, c.d_model)
_E = lambda c: (c.d_model,)
_Q_E = lambda c: (c.n_heads * c.head_dim, c.d_model)
_KV_E = lambda c: (c.n_kv_heads * c.head_dim, c.d_model)
_E_Q = lambda c: (c.d_model, c.n_heads * c.head_dim)
_F_E = lambda c: (c.mlp_hidden, c.d_model)
_E_F = lambda c: (c.d_model, c.mlp_hidden)
_Q = lambda c: (c.n_heads * c.head_dim,)
_KV = lambda c: (c.n_kv_heads * c.head_dim,)


def _rules(prefix: str, rows) -> tuple[Rule, ...]:
  return tuple(Rule(prefix + hf, path, transform, shape)
               for hf, path, transform, shape in rows)


LLADA = _rules("model.transformer.", [
    ("wte.weight", "embed", "identity", _V_E),
    ("ff_out.weight", "lm_head", "transpose", _V_E),
    ("ln_f.weight", "final_norm/scale", "identity", _E),
]) + _rules("model.transformer.blocks.{layer}.", [
    ("attn_norm.weight", "layers_{layer}/attn_norm/scale", "identity", _E),
    ("q_proj.weight", "layers_{layer}/q_proj/kernel", "transpose", _Q_E),
    ("k_proj.weight", "layers_{layer}/k_proj/kernel", "transpose", _KV_E),
    ("v_proj.weight", "layers_{layer}/v_proj/kernel", "transpose", _KV_E),
    ("attn_out.weight", "layers_{layer}/attn_out/kernel", "transpose", _E_Q),
    ("ff_norm.weight", "layers_{layer}/mlp_norm/scale", "identity", _E),
    ("ff_proj.weight", "layers_{layer}/gate_proj/kernel", "transpose", _F_E),
    ("up_proj.weight", "layers_{layer}/up_proj/kernel", "transpose", _F_E),
    ("ff_out.weight", "layers_{layer}/down_proj/kernel", "transpose", _E_F),
])

DREAM = _rules("", [
    ("model.embed_tokens.weight", "embed", "identity", _V_E),
    ("lm_head.weight", "lm_head", "transpose", _V_E),
    ("model.norm.weight", "final_norm/scale", "identity", _E),
]) + _rules("model.layers.{layer}.", [
    ("input_layernorm.weight", "layers_{layer}/attn_norm/scale", "identity",
     _E),
    ("self_attn.q_proj.weight", "layers_{layer}/q_proj/kernel", "transpose",
     _Q_E),
    ("self_attn.q_proj.bias", "layers_{layer}/q_proj/bias", "identity", _Q),
    ("self_attn.k_proj.weight", "layers_{layer}/k_proj/kernel", "transpose",
     _KV_E),
    ("self_attn.k_proj.bias", "layers_{layer}/k_proj/bias", "identity", _KV),
    ("self_attn.v_proj.weight", "layers_{layer}/v_proj/kernel", "transpose",
     _KV_E),
    ("self_attn.v_proj.bias", "layers_{layer}/v_proj/bias", "identity", _KV),
    ("self_attn.o_proj.weight", "layers_{layer}/attn_out/kernel", "transpose",
     _E_Q),
    ("post_attention_layernorm.weight", "layers_{layer}/mlp_norm/scale",
     "identity", _E),
    ("mlp.gate_proj.weight", "layers_{layer}/gate_proj/kernel", "transpose",
     _F_E),
    ("mlp.up_proj.weight", "layers_{layer}/up_proj/kernel", "transpose", _F_E),
    ("mlp.down_proj.weight", "layers_{layer}/down_proj/kernel", "transpose",
     _E_F),
])

@dataclasses.dataclass(frozen=True)
class Mapped:
  """One HF tensor resolved against a table and a config."""
  hf_name: str
  param_path: str
  rule: Rule
  expected_shape: Shape


def resolve(name: str, table: tuple[Rule, ...],
            config: ModelConfig) -> Mapped | None:
  """The mapping of HF tensor `name`, or None if no rule (or no layer of the
  config) claims it."""
  for rule in table:
    match = rule.pattern.fullmatch(name)
    if match is None:
      continue
    layer = int(match["layer"]) if rule.per_layer else None
    if layer is not None and layer >= config.n_layers:
      return None
    path = rule.param_path.format(layer=layer)
    return Mapped(name, path, rule, tuple(rule.hf_shape(config)))
  return None


def expected_names(table: tuple[Rule, ...], config: ModelConfig) -> list[str]:
  """Every HF tensor name a checkpoint of `config` must contain."""
  names = []
  for rule in table:
    layers = range(config.n_layers) if rule.per_layer else [None]
    names += [rule.hf_name.format(layer=i) for i in layers]
  return names
