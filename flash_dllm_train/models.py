"""The ModelConfig of a project-trained model from its architecture and
sizes: LLaDA (dense, full attention) or LLaDA2 (block-causal MoE)."""

from __future__ import annotations

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.moe_config import MoEConfig

ARCHS = ("llada", "llada2")


def train_config(arch: str, special_ids: dict, *, vocab_size: int,
                 layers: int, d_model: int, heads: int, kv_heads: int | None,
                 mlp_hidden: int, rope_theta: float, max_seq_len: int,
                 dtype: str, experts: int = 8, top_k: int = 2,
                 expert_hidden: int = 128, shared_experts: int = 1,
                 dense_layers: int = 1) -> ModelConfig:
  """LLaDA: Llama blocks with a SwiGLU MLP of mlp_hidden. LLaDA2: its
  numerics (QK-norm, RoPE on half of each head, eps 1e-6), the first
  `dense_layers` layers with a dense MLP of mlp_hidden, then `experts`
  routed experts of width expert_hidden, top_k per token, sigmoid router
  with an expert bias, and `shared_experts` shared ones."""
  if arch not in ARCHS:
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
  common = dict(vocab_size=vocab_size, d_model=d_model, n_layers=layers,
                n_heads=heads, n_kv_heads=kv_heads or heads,
                head_dim=d_model // heads, mlp_hidden=mlp_hidden,
                rope_theta=rope_theta, max_seq_len=max_seq_len, dtype=dtype,
                **special_ids)
  if arch == "llada":
    return ModelConfig(arch="llada", rms_norm_eps=1e-5, **common)
  moe = MoEConfig(n_experts=experts, top_k=top_k, hidden=expert_hidden,
                  n_shared=shared_experts, first_dense_layers=dense_layers,
                  routed_scaling=1.0)
  return ModelConfig(arch="llada2", rms_norm_eps=1e-6, rope_fraction=0.5,
                     moe=moe, **common)
