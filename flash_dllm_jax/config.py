"""Model configuration: one frozen dataclass for LLaDA and Dream."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

Architecture = Literal["llada", "dream"]
_DTYPES = ("bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Geometry, numerics and special token ids of a masked-diffusion LM.

  `arch` switches the few places where LLaDA and Dream differ: q/k/v biases,
  RoPE precision (LLaDA rotates in float32, Dream casts cos/sin to the
  activation dtype) and Dream's logit shift (position i is predicted by raw
  logits row i-1).
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

  def __post_init__(self):
    errors = []
    if self.arch not in ("llada", "dream"):
      errors.append(f"arch must be 'llada' or 'dream', got {self.arch!r}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                 "head_dim", "mlp_hidden", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        errors.append(f"{name} must be a positive int, got {value!r}")
    if not errors:
      if self.n_heads % self.n_kv_heads:
        errors.append(f"n_heads ({self.n_heads}) must be a multiple of "
                      f"n_kv_heads ({self.n_kv_heads})")
      if self.head_dim % 2:
        errors.append(f"head_dim must be even for RoPE, got {self.head_dim}")
      for name in ("mask_token_id", "eos_token_id", "pad_token_id",
                   "bos_token_id", "eot_token_id"):
        value = getattr(self, name)
        if value is not None and not 0 <= value < self.vocab_size:
          errors.append(f"{name}={value} is outside the vocabulary "
                        f"[0, {self.vocab_size})")
      if self.mask_token_id == self.eos_token_id:
        errors.append("mask_token_id must differ from eos_token_id")
    if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
      errors.append("rms_norm_eps and rope_theta must be positive")
    if self.dtype not in _DTYPES:
      errors.append(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
    if errors:
      raise ValueError("invalid ModelConfig: " + "; ".join(errors))

  # Derived quantities ---------------------------------------------------------
  @property
  def q_per_kv(self) -> int:
    return self.n_heads // self.n_kv_heads

  @property
  def qkv_bias(self) -> bool:
    return self.arch == "dream"

  @property
  def rope_in_float32(self) -> bool:
    return self.arch == "llada"

  @property
  def logits_shift(self) -> int:
    """How many positions earlier the row predicting position i sits."""
    return 1 if self.arch == "dream" else 0

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """Tokens that end an answer: EOS, and EOT where the chat format has one."""
    ids = [self.eos_token_id]
    if self.eot_token_id is not None and self.eot_token_id != self.eos_token_id:
      ids.append(self.eot_token_id)
    return tuple(ids)

  def num_params(self) -> int:
    e, f, v = self.d_model, self.mlp_hidden, self.vocab_size
    q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    per_layer = 2 * e + e * q + 2 * e * kv + q * e + 3 * e * f
    if self.qkv_bias:
      per_layer += q + 2 * kv
    return self.n_layers * per_layer + 2 * v * e + e

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
    return cls(**d)

  # Hugging Face configs -------------------------------------------------------
  @classmethod
  def from_hf_config(cls, hf: dict[str, Any] | str | Path,
                     eot_token_id: int | None = None,
                     dtype: str = "bfloat16",
                     generation_config: dict[str, Any] | None = None,
                     ) -> "ModelConfig":
    """Reads a checkpoint's `config.json` (a dict or a path to it).

    `generation_config` (the checkpoint's generation_config.json) fills ids the
    model config lacks, such as LLaDA's BOS.
    """
    if not isinstance(hf, dict):
      hf = json.loads(Path(hf).read_text())
    if generation_config:
      hf = {**{k: v for k, v in generation_config.items()
               if k.endswith("_token_id") and v is not None}, **hf}
    model_type = hf.get("model_type")
    reader = _HF_READERS.get(str(model_type).lower())
    if reader is None:
      raise ValueError(f"unknown model_type {model_type!r}: expected one of "
                       f"'llada' (LLaDA-8B, LLaDA-1.5) or 'Dream' (Dream-v0)")
    try:
      fields = reader(hf)
    except KeyError as e:
      raise ValueError(f"config.json of model_type {model_type!r} lacks key "
                       f"{e.args[0]!r}") from None
    return cls(**fields, eot_token_id=eot_token_id, dtype=dtype)

  # Presets --------------------------------------------------------------------
  @classmethod
  def llada_8b(cls, **changes) -> "ModelConfig":
    return cls(arch="llada", vocab_size=126464, d_model=4096, n_layers=32,
               n_heads=32, n_kv_heads=32, head_dim=128, mlp_hidden=12288,
               rms_norm_eps=1e-5, rope_theta=500000.0, max_seq_len=4096,
               mask_token_id=126336, eos_token_id=126081, pad_token_id=126081,
               bos_token_id=126080, eot_token_id=126348).replace(**changes)

  @classmethod
  def dream_7b(cls, **changes) -> "ModelConfig":
    return cls(arch="dream", vocab_size=152064, d_model=3584, n_layers=28,
               n_heads=28, n_kv_heads=4, head_dim=128, mlp_hidden=18944,
               rms_norm_eps=1e-6, rope_theta=1e6, max_seq_len=131072,
               mask_token_id=151666, eos_token_id=151643, pad_token_id=151643,
               bos_token_id=151643, eot_token_id=151645).replace(**changes)

  @classmethod
  def tiny(cls, arch: Architecture = "llada", **changes) -> "ModelConfig":
    """A few-layer model for tests: GQA 4:2, vocabulary of 384 ids."""
    base = dict(arch=arch, vocab_size=384, d_model=64, n_layers=2, n_heads=4,
                n_kv_heads=2, head_dim=16, mlp_hidden=128,
                rms_norm_eps=1e-5 if arch == "llada" else 1e-6,
                rope_theta=500000.0 if arch == "llada" else 1e6,
                max_seq_len=512, mask_token_id=383, eos_token_id=380,
                pad_token_id=380, bos_token_id=379, eot_token_id=381,
                dtype="float32")
    base.update(changes)
    return cls(**base)


def _read_llada(hf: dict[str, Any]) -> dict[str, Any]:
  unsupported = {
      "alibi": (False,), "block_type": ("llama",), "activation_type": ("silu",),
      "layer_norm_type": ("rms",), "include_bias": (False,),
      "include_qkv_bias": (False,), "attention_layer_norm": (False,),
      "weight_tying": (False,), "rope": (True,), "scale_logits": (False,),
      "input_emb_norm": (False,), "block_group_size": (1,),
  }
  bad = [f"{k}={hf[k]!r}" for k, ok in unsupported.items()
         if k in hf and hf[k] not in ok]
  if bad:
    raise ValueError("unsupported LLaDA config values: " + ", ".join(bad))
  n_heads = hf["n_heads"]
  n_kv = hf.get("n_kv_heads") or n_heads
  mlp_hidden = hf.get("mlp_hidden_size") or hf["mlp_ratio"] * hf["d_model"]
  return dict(
      arch="llada", vocab_size=hf.get("embedding_size") or hf["vocab_size"],
      d_model=hf["d_model"], n_layers=hf["n_layers"], n_heads=n_heads,
      n_kv_heads=n_kv, head_dim=hf["d_model"] // n_heads,
      mlp_hidden=mlp_hidden, rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
      rope_theta=float(hf.get("rope_theta", 10000.0)),
      max_seq_len=hf["max_sequence_length"],
      mask_token_id=hf["mask_token_id"], eos_token_id=hf["eos_token_id"],
      pad_token_id=hf.get("pad_token_id", hf["eos_token_id"]),
      bos_token_id=hf.get("bos_token_id"))


def _read_dream(hf: dict[str, Any]) -> dict[str, Any]:
  bad = []
  if hf.get("tie_word_embeddings", False):
    bad.append("tie_word_embeddings=True")
  if hf.get("rope_scaling") is not None:
    bad.append(f"rope_scaling={hf['rope_scaling']!r}")
  if hf.get("use_sliding_window", False):
    bad.append("use_sliding_window=True")
  if hf.get("hidden_act", "silu") != "silu":
    bad.append(f"hidden_act={hf['hidden_act']!r}")
  if bad:
    raise ValueError("unsupported Dream config values: " + ", ".join(bad))
  n_heads = hf["num_attention_heads"]
  return dict(
      arch="dream", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      n_layers=hf["num_hidden_layers"], n_heads=n_heads,
      n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
      mlp_hidden=hf["intermediate_size"], rms_norm_eps=hf["rms_norm_eps"],
      rope_theta=float(hf["rope_theta"]),
      max_seq_len=hf["max_position_embeddings"],
      mask_token_id=hf["mask_token_id"], eos_token_id=hf["eos_token_id"],
      pad_token_id=hf.get("pad_token_id", hf["eos_token_id"]),
      bos_token_id=hf.get("bos_token_id"))


_HF_READERS = {"llada": _read_llada, "dream": _read_dream}
