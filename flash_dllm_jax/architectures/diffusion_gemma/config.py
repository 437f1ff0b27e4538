"""DiffusionGemma's configuration: the text fields of Gemma 4's
TransformerConfig (gemma/gm/nn/gemma4/_config.py) under this engine's
names, the special ids and the compute dtype.

`GemmaConfig.from_official(tc, special)` reads the dict form of a
TransformerConfig (the "transformer_config" of a checkpoint's config.json;
`attention_types` as enum names "LOCAL_SLIDING"/"GLOBAL" or their values
2/1) and the "special_tokens" ids; `preset("DiffusionGemma_26B_A4B")` is
the published model's (Gemma4_26B_A4B's config, the diffusion model's
backbone). What the text path of the genuine code cannot be configured to
(per-layer inputs, KV-cache sharing) is refused with one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flash_dllm_jax import architectures, quantize, roles

ARCH = "diffusion_gemma"
LOCAL, GLOBAL = "local", "global"
_KINDS = {"LOCAL_SLIDING": LOCAL, "GLOBAL": GLOBAL, 2: LOCAL, 1: GLOBAL,
          LOCAL: LOCAL, GLOBAL: GLOBAL}
# Gemma 4 tokenizer ids (gm/text/_tokenizer.py, _Gemma4SpecialTokens).
GEMMA4_SPECIAL = dict(pad=0, eos=1, bos=2, unk=3, mask=4, start_of_turn=105,
                      end_of_turn=106, begin_of_tool_response=50)
_DTYPES = ("bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """Geometry and numerics of a DiffusionGemma text model.

  layer_kinds: "local" (sliding window `sliding_window`, head_dim,
  n_kv_heads, local RoPE) or "global" per layer (global_head_dim,
  n_global_kv_heads, K=V when k_eq_v_global, global RoPE). RoPE rotates
  the first int(fraction * head_dim // 2) angle pairs of each half.
  moe_experts = 0: a dense MLP of mlp_hidden; else the MoE beside a dense
  shared MLP of mlp_hidden. sc_hidden: the self-conditioning MLP's width.
  stop ids: EOS, END_OF_TURN, BEGIN_OF_TOOL_RESPONSE (the official
  sampler's end tokens). Token 0 is padding and the canvas's "mask".
  """

  vocab_size: int
  d_model: int
  mlp_hidden: int
  n_heads: int
  head_dim: int
  n_kv_heads: int
  layer_kinds: tuple[str, ...]
  sliding_window: int
  final_logit_softcap: float | None = None
  attn_logits_softcap: float | None = None
  use_post_attn_norm: bool = True
  use_post_ffw_norm: bool = True
  qk_norm_with_scale: bool = True
  n_global_kv_heads: int | None = None
  global_head_dim: int | None = None
  k_eq_v_global: bool = False
  local_rope_fraction: float = 1.0
  global_rope_fraction: float = 1.0
  local_rope_base: float = 10_000.0
  global_rope_base: float = 10_000.0
  local_rope_scale: float = 1.0
  global_rope_scale: float = 1.0
  moe_experts: int = 0
  moe_hidden: int = 0
  moe_top_k: int = 8
  sc_hidden: int = 0
  eos_token_id: int = 1
  bos_token_id: int = 2
  end_of_turn_id: int = 106
  tool_response_id: int = 50
  text_vocab_size: int | None = None
  max_seq_len: int = 131072
  dtype: str = "bfloat16"
  arch: str = ARCH
  pad_token_id: int = 0
  mask_token_id: int = 0
  quantize: str | None = None
  quantize_head: bool = False
  quantize_embedding: bool = False

  def __post_init__(self):
    errors = []
    for name in ("vocab_size", "d_model", "mlp_hidden", "n_heads", "head_dim",
                 "n_kv_heads", "sliding_window", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        errors.append(f"{name} must be a positive int, got {value!r}")
    bad = [k for k in self.layer_kinds if k not in (LOCAL, GLOBAL)]
    if not self.layer_kinds or bad:
      errors.append(f"layer_kinds must be a non-empty tuple of {LOCAL!r}/"
                    f"{GLOBAL!r}, got {self.layer_kinds!r}")
    for kind in (LOCAL, GLOBAL):
      heads, dim = self.kv_heads(kind), self.key_size(kind)
      if not errors and self.n_heads % heads:
        errors.append(f"n_heads ({self.n_heads}) must be a multiple of the "
                      f"{kind} kv heads ({heads})")
      if dim % 2:
        errors.append(f"the {kind} head size ({dim}) must be even for RoPE")
    if self.moe_experts and not (0 < self.moe_top_k <= self.moe_experts
                                 and self.moe_hidden > 0):
      errors.append(f"an MoE needs 0 < moe_top_k ({self.moe_top_k}) <= "
                    f"moe_experts ({self.moe_experts}) and moe_hidden > 0")
    if self.dtype not in _DTYPES:
      errors.append(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
    if self.quantize is not None:
      if self.quantize not in quantize.FORMATS:
        errors.append(f"quantize must be None or one of "
                      f"{tuple(quantize.FORMATS)}, got {self.quantize!r}")
    if self.quantize_head or self.quantize_embedding:
      errors.append("DiffusionGemma keeps its tied embedding unquantized "
                    "(quantize_head and quantize_embedding must be False)")
    for name in ("eos_token_id", "bos_token_id", "end_of_turn_id",
                 "tool_response_id"):
      if not 0 <= getattr(self, name) < self.vocab_size:
        errors.append(f"{name}={getattr(self, name)} is outside the "
                      f"vocabulary [0, {self.vocab_size})")
    if errors:
      raise ValueError("invalid DiffusionGemma config: " + "; ".join(errors))

  # Derived --------------------------------------------------------------------
  @property
  def n_layers(self) -> int:
    return len(self.layer_kinds)

  @property
  def sc_width(self) -> int:
    return self.sc_hidden or self.mlp_hidden

  @property
  def n_text_ids(self) -> int:
    """Ids the canvas's noise is drawn from (the tokenizer's vocab size)."""
    return self.text_vocab_size or self.vocab_size

  def kv_heads(self, kind: str) -> int:
    if kind == GLOBAL and self.n_global_kv_heads:
      return self.n_global_kv_heads
    return self.n_kv_heads

  def key_size(self, kind: str) -> int:
    if kind == GLOBAL and self.global_head_dim:
      return self.global_head_dim
    return self.head_dim

  def rope(self, kind: str) -> tuple[float, float, float]:
    """(fraction, base, scale) of `kind`'s RoPE."""
    if kind == GLOBAL:
      return (self.global_rope_fraction, self.global_rope_base,
              self.global_rope_scale)
    return (self.local_rope_fraction, self.local_rope_base,
            self.local_rope_scale)

  def k_eq_v(self, kind: str) -> bool:
    return kind == GLOBAL and self.k_eq_v_global

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    return (self.eos_token_id, self.end_of_turn_id, self.tool_response_id)

  @property
  def spec(self):
    return architectures.get(self.arch)

  def param_roles(self) -> dict:
    """{param path: roles.Role} of the official tree (parallel.py splits
    "model" by it): q/k/v by heads and the MLPs' gate/up by width
    (whole heads and columns per device), attn_vec and the MLPs' down by
    output columns (their input gathered first: sharding.py), the expert
    stacks by expert. A dimension the mesh does not divide (a global
    layer's kv heads) stays whole. Replicated: norms, the router, and the
    tied embedding (encode_logits sums over the vocabulary, which a
    vocabulary split would turn into per-device partial sums). 8-bit
    weights (quant.py) split only their expert stacks."""
    dim = lambda axis: roles.Role(shard="dim", axis=axis)
    cols = roles.Role(shard="columns")
    mlp = lambda p: {p + "gating_einsum": dim(1), p + "linear": cols}
    out = mlp("self_conditioner/ffw/")
    for i, kind in enumerate(self.layer_kinds):
      a = f"layer_{i}/attn/"
      out[a + "q_einsum/w"] = dim(0)
      out[a + ("k_einsum/w" if self.k_eq_v(kind) else "kv_einsum/w")] = (
          dim(0) if self.k_eq_v(kind) else dim(1))
      out[a + "attn_vec_einsum/w"] = cols
      if not self.moe_experts:
        out.update(mlp(f"layer_{i}/mlp/"))
        continue
      out.update(mlp(f"layer_{i}/mlp2/"))
      for name in ("gating_einsum/w", "linear/w", "per_expert_scale"):
        out[f"layer_{i}/mlp/{name}"] = roles.Role(shard="experts")
      if self.quantize:  # quant.py's 8-bit stacks [X, O, I] and [X, O, Z]
        for name in ("gating_einsum/w/", "linear/w/"):
          for leaf in ("kernel_q", "scale"):
            out[f"layer_{i}/mlp/{name}{leaf}"] = roles.Role(shard="experts")
    return out

  def mesh_divisors(self) -> list[tuple[str, int]]:
    """What `--mesh model=M` must divide (parallel.check_config): the
    query heads, the local layers' kv heads, the MLP widths and the
    experts (a global layer's kv heads are replicated where M does not
    divide them)."""
    sizes = [("n_heads", self.n_heads), ("n_kv_heads", self.n_kv_heads),
             ("mlp_hidden", self.mlp_hidden), ("sc_hidden", self.sc_width)]
    return sizes + ([("moe_experts", self.moe_experts)]
                    if self.moe_experts else [])

  def replace(self, **changes) -> "GemmaConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  # Official configs -----------------------------------------------------------
  @classmethod
  def from_official(cls, tc: Mapping[str, Any],
                    special: Mapping[str, int] | None = None,
                    **changes) -> "GemmaConfig":
    """From a TransformerConfig's fields (dict) and the special ids."""
    tc = dict(tc)
    refused = []
    if tc.get("per_layer_input_dim"):
      refused.append(f"per_layer_input_dim={tc['per_layer_input_dim']}")
    if tc.get("kv_cache_sharing_config"):
      refused.append("kv_cache_sharing_config")
    if refused:
      raise ValueError("unsupported DiffusionGemma transformer_config "
                       "values: " + ", ".join(refused))
    try:
      kinds = tuple(_KINDS[k] for k in tc["attention_types"])
    except KeyError as e:
      raise ValueError(f"unknown attention type {e.args[0]!r} (expected "
                       "LOCAL_SLIDING or GLOBAL)") from None
    moe = bool(tc.get("enable_moe"))
    ids = {**GEMMA4_SPECIAL, **dict(special or {})}
    fields = dict(
        vocab_size=tc["num_embed"], d_model=tc["embed_dim"],
        mlp_hidden=tc["moe_dense_hidden_dim"] if moe else tc["hidden_dim"],
        sc_hidden=tc["hidden_dim"], n_heads=tc["num_heads"],
        head_dim=tc["head_dim"], n_kv_heads=tc["num_kv_heads"],
        layer_kinds=kinds,
        sliding_window=tc.get("sliding_window_size") or 0,
        final_logit_softcap=tc.get("final_logit_softcap"),
        attn_logits_softcap=tc.get("attn_logits_soft_cap"),
        use_post_attn_norm=tc["use_post_attn_norm"],
        use_post_ffw_norm=tc["use_post_ffw_norm"],
        qk_norm_with_scale=tc.get("qk_norm_with_scale", True),
        n_global_kv_heads=tc.get("num_global_kv_heads"),
        global_head_dim=tc.get("global_key_size"),
        k_eq_v_global=bool(tc.get("k_eq_v_global", False)),
        local_rope_fraction=_fraction(tc.get("local_rope_proportion")),
        global_rope_fraction=_fraction(tc.get("global_rope_proportion")),
        local_rope_base=float(tc.get("local_base_frequency", 10_000)),
        global_rope_base=float(tc.get("global_base_frequency", 10_000)),
        local_rope_scale=float(tc.get("local_scale_factor", 1.0)),
        global_rope_scale=float(tc.get("global_scale_factor", 1.0)),
        moe_experts=tc.get("num_experts", 0) if moe else 0,
        moe_hidden=tc.get("expert_dim", 0) if moe else 0,
        moe_top_k=tc.get("top_k_experts", 8),
        eos_token_id=ids["eos"], bos_token_id=ids["bos"],
        end_of_turn_id=ids["end_of_turn"],
        tool_response_id=ids["begin_of_tool_response"])
    if LOCAL in kinds and fields["sliding_window"] <= 0:
      raise ValueError("local (LOCAL_SLIDING) layers need a "
                       "sliding_window_size")
    if not fields["sliding_window"]:
      fields["sliding_window"] = 1  # unused: no local layer
    return cls(**{**fields, **changes})


def _fraction(value) -> float:
  """The official default (None) rotates the whole head."""
  return 1.0 if value is None else float(value)


_PATTERN = ("LOCAL_SLIDING",) * 5 + ("GLOBAL",)
# Gemma4_26B_A4B.config (gemma/gm/nn/gemma4/_gemma4.py), text fields.
OFFICIAL_26B_A4B = dict(
    num_embed=262144, embed_dim=2816, hidden_dim=2112, num_heads=16,
    head_dim=256, num_kv_heads=8, final_logit_softcap=30.0,
    num_global_kv_heads=2, use_post_attn_norm=True, use_post_ffw_norm=True,
    qk_norm_with_scale=True, attention_types=_PATTERN * 5,
    global_key_size=512, k_eq_v_global=True, global_rope_proportion=0.25,
    local_rope_proportion=1.0, attn_logits_soft_cap=None,
    sliding_window_size=1024, local_base_frequency=10_000,
    global_base_frequency=1_000_000, per_layer_input_dim=0, enable_moe=True,
    num_experts=128, expert_dim=704, top_k_experts=8,
    moe_dense_hidden_dim=2112)
PRESETS = {"DiffusionGemma_26B_A4B": OFFICIAL_26B_A4B}


def preset(name: str, **changes) -> GemmaConfig:
  if name not in PRESETS:
    raise ValueError(f"unknown DiffusionGemma preset {name!r}; known: "
                     f"{', '.join(PRESETS)}")
  return GemmaConfig.from_official(PRESETS[name], GEMMA4_SPECIAL, **changes)
