"""Model configuration: one frozen dataclass for every architecture."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from flash_dllm_jax import architectures, quantize
from flash_dllm_jax.moe_config import MoEConfig

Architecture = str  # a name in flash_dllm_jax.architectures.ARCHITECTURES
_DTYPES = ("bfloat16", "float32")
# Hugging Face config.json keys that are sizes: positive ints where present.
HF_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "moe_intermediate_size",
            "max_position_embeddings", "num_experts", "num_experts_per_tok",
            "n_group", "topk_group")


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_hf_numbers(hf: dict[str, Any], where: str = "config.json") -> None:
  """One ValueError naming every key of a Hugging Face config whose number
  is NaN or infinite (Python's json reads NaN / Infinity), or a size
  (HF_SIZES) that is not a positive int; before the family reads them."""
  bad = [f"{k} must be a finite number, got {v!r}" for k, v in hf.items()
         if isinstance(v, float) and not math.isfinite(v)]
  bad += [f"{k} must be a positive int, got {hf[k]!r}" for k in HF_SIZES
          if hf.get(k) is not None and not (_is_int(hf[k]) and hf[k] > 0)]
  if bad:
    raise ValueError(f"{where}: " + "; ".join(bad))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Geometry, numerics and special token ids of a masked-diffusion LM.

  `arch` names the architecture spec (flash_dllm_jax/architectures/<arch>/)
  that fixes the model's parts: its attention (q/k/v biases, QK-norm, RoPE
  precision, mask kind), its logit shift and its tensor names. The fields
  here are what a checkpoint's config.json sets: the geometry, `rope_fraction`
  (the leading fraction of each head's dims that RoPE rotates) and `moe`
  (None: a dense MLP in every layer).
  """

  arch: Architecture
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_hidden: int
  rms_norm_eps: float
  rope_theta: float
  max_seq_len: int
  mask_token_id: int
  eos_token_id: int
  pad_token_id: int
  bos_token_id: int | None = None
  eot_token_id: int | None = None  # LLaDA <|eot_id|>, Dream <|im_end|>
  dtype: str = "bfloat16"  # compute dtype
  quantize: str | None = None  # 8-bit weight format (quantize.FORMATS)
  quantize_head: bool = False  # the LM head quantized too
  quantize_embedding: bool = False  # the token embedding too (per row)
  fused_qkv: bool = False  # one qkv_proj per layer (model/fuse.py)
  rope_fraction: float = 1.0
  moe: MoEConfig | None = None

  def __post_init__(self):
    errors = []
    known = architectures.names()
    if self.arch not in known:
      errors.append(f"arch must be one of {known}, got {self.arch!r}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                 "head_dim", "mlp_hidden", "max_seq_len"):
      value = getattr(self, name)
      if not _is_int(value) or value <= 0:
        errors.append(f"{name} must be a positive int, got {value!r}")
    for name in ("mask_token_id", "eos_token_id", "pad_token_id",
                 "bos_token_id", "eot_token_id"):
      value = getattr(self, name)
      if value is not None and not _is_int(value):
        errors.append(f"{name} must be an int, got {value!r}")
    for name in ("rms_norm_eps", "rope_theta"):
      value = getattr(self, name)
      if not (_is_real(value) and math.isfinite(value) and value > 0):
        errors.append(f"{name} must be a finite number > 0, got {value!r}")
    if not errors:
      if self.n_heads % self.n_kv_heads:
        errors.append(f"n_heads ({self.n_heads}) must be a multiple of "
                      f"n_kv_heads ({self.n_kv_heads})")
      if not (isinstance(self.rope_fraction, (int, float))
              and 0 < self.rope_fraction <= 1):
        errors.append(f"rope_fraction must be in (0, 1], got "
                      f"{self.rope_fraction!r}")
      elif self.rope_dim % 2:
        errors.append(f"the rotated head dims ({self.rope_dim} of "
                      f"{self.head_dim}) must be even for RoPE")
      for name in ("mask_token_id", "eos_token_id", "pad_token_id",
                   "bos_token_id", "eot_token_id"):
        value = getattr(self, name)
        if value is not None and not 0 <= value < self.vocab_size:
          errors.append(f"{name}={value} is outside the vocabulary "
                        f"[0, {self.vocab_size})")
      if self.mask_token_id == self.eos_token_id:
        errors.append("mask_token_id must differ from eos_token_id")
    if self.moe is not None and not isinstance(self.moe, MoEConfig):
      errors.append(f"moe must be a MoEConfig or None, got {self.moe!r}")
    elif self.moe is not None and self.moe.first_dense_layers > self.n_layers:
      errors.append(f"moe.first_dense_layers ({self.moe.first_dense_layers})"
                    f" exceeds n_layers ({self.n_layers})")
    if not isinstance(self.fused_qkv, bool):
      errors.append(f"fused_qkv must be a bool, got {self.fused_qkv!r}")
    if self.dtype not in _DTYPES:
      errors.append(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
    if self.quantize is not None and self.quantize not in quantize.FORMATS:
      errors.append(f"quantize must be None or one of "
                    f"{tuple(quantize.FORMATS)}, got {self.quantize!r}")
    for name in ("quantize_head", "quantize_embedding"):
      value = getattr(self, name)
      if value not in (True, False):
        errors.append(f"{name} must be a bool, got {value!r}")
      elif value and self.quantize is None:
        errors.append(f"{name}=True needs a quantize format")
    if errors:
      raise ValueError("invalid ModelConfig: " + "; ".join(errors))

  # Derived quantities ---------------------------------------------------------
  @property
  def q_per_kv(self) -> int:
    return self.n_heads // self.n_kv_heads

  @property
  def rope_dim(self) -> int:
    """How many leading dims of each head RoPE rotates."""
    return int(self.head_dim * self.rope_fraction)

  def is_moe_layer(self, layer: int) -> bool:
    return self.moe is not None and layer >= self.moe.first_dense_layers

  @property
  def spec(self):
    """The architecture's spec (flash_dllm_jax.architectures.Architecture)."""
    return architectures.get(self.arch)

  @property
  def qkv_bias(self) -> bool:
    return self.spec.attention.qkv_bias

  @property
  def rope_in_float32(self) -> bool:
    return self.spec.attention.rope_in_float32

  @property
  def logits_shift(self) -> int:
    """How many positions earlier the row predicting position i sits."""
    return self.spec.logits_shift

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """Tokens that end an answer: EOS, and EOT where the chat format has one."""
    ids = [self.eos_token_id]
    if self.eot_token_id is not None and self.eot_token_id != self.eos_token_id:
      ids.append(self.eot_token_id)
    return tuple(ids)

  def num_params(self) -> int:
    """Every parameter, all experts counted."""
    e, v = self.d_model, self.vocab_size
    q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    attention = 2 * e + e * q + 2 * e * kv + q * e
    attention += (q + 2 * kv) * self.qkv_bias
    attention += 2 * self.head_dim * self.spec.attention.qk_norm
    total = 0
    for layer in range(self.n_layers):
      total += attention
      if self.is_moe_layer(layer):
        m = self.moe
        total += (e * m.n_experts + m.n_experts * m.expert_bias
                  + 3 * e * m.hidden * (m.n_experts + m.n_shared))
      else:
        total += 3 * e * self.mlp_hidden
    return total + 2 * v * e + e

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"unknown ModelConfig keys: {unknown}")
    if isinstance(d.get("moe"), dict):
      d = {**d, "moe": MoEConfig(**d["moe"])}
    return cls(**d)

  # Hugging Face configs -------------------------------------------------------
  @classmethod
  def from_hf_config(cls, hf: dict[str, Any] | str | Path,
                     eot_token_id: int | None = None,
                     dtype: str = "bfloat16",
                     generation_config: dict[str, Any] | None = None,
                     special_ids: dict[str, int] | None = None,
                     ) -> "ModelConfig":
    """Reads a checkpoint's `config.json` (a dict or a path to it).

    `generation_config` (the checkpoint's generation_config.json) fills ids the
    model config lacks, such as LLaDA's BOS; `special_ids` are the
    tokenizer's ({"mask_token_id": ..., "eos_token_id": ...}), for families
    whose config lacks them.
    """
    if not isinstance(hf, dict):
      hf = json.loads(Path(hf).read_text())
    if generation_config:
      hf = {**{k: v for k, v in generation_config.items()
               if k.endswith("_token_id") and v is not None}, **hf}
    model_type = hf.get("model_type")
    spec = architectures.for_model_type(model_type)
    check_hf_numbers(hf)
    try:
      fields = spec.read_hf_config(hf, dict(special_ids or {}))
    except KeyError as e:
      raise ValueError(f"config.json of model_type {model_type!r} lacks key "
                       f"{e.args[0]!r}") from None
    return cls(**fields, eot_token_id=eot_token_id, dtype=dtype)

  # Presets --------------------------------------------------------------------
  @classmethod
  def preset(cls, name: str, **changes) -> "ModelConfig":
    """A published model's shapes ('llada-8b', 'dream-7b', ...: every
    architecture's `presets`), with `changes`."""
    return cls(**architectures.preset(name)).replace(**changes)

  @classmethod
  def tiny(cls, arch: Architecture, **changes) -> "ModelConfig":
    """A few-layer model of `arch` for tests: GQA 4:2, 384 ids, plus what
    the architecture's `tiny_changes` set (its numerics, an MoE)."""
    base = dict(arch=arch, vocab_size=384, d_model=64, n_layers=2, n_heads=4,
                n_kv_heads=2, head_dim=16, mlp_hidden=128, max_seq_len=512,
                rms_norm_eps=1e-5, rope_theta=10000.0, mask_token_id=383,
                eos_token_id=380, pad_token_id=380, bos_token_id=379,
                eot_token_id=381, dtype="float32")
    base.update(architectures.get(arch).tiny_changes)
    base.update(changes)
    return cls(**base)
