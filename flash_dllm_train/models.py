"""The config of a project-trained model from its architecture and sizes:
LLaDA (dense, full attention), LLaDA2 (block-causal MoE) or DiffusionGemma
(a canvas denoiser); its random init and how its checkpoint is written."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from flash_dllm_jax.architectures.diffusion_gemma import checkpoint as dg_ckpt
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    ARCH as GEMMA, GEMMA4_SPECIAL, GemmaConfig)
from flash_dllm_jax.checkpoint_files import save as save_converted
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params
from flash_dllm_jax.moe_config import MoEConfig

ARCHS = ("llada", "llada2", GEMMA)


def train_config(arch: str, special_ids: dict, *, vocab_size: int,
                 layers: int, d_model: int, heads: int, kv_heads: int | None,
                 mlp_hidden: int, rope_theta: float, max_seq_len: int,
                 dtype: str, experts: int = 8, top_k: int = 2,
                 expert_hidden: int = 128, shared_experts: int = 1,
                 dense_layers: int = 1, sliding_window: int = 128,
                 global_every: int = 4) -> ModelConfig | GemmaConfig:
  """LLaDA: Llama blocks with a SwiGLU MLP of mlp_hidden. LLaDA2: its
  numerics (QK-norm, RoPE on half of each head, eps 1e-6), the first
  `dense_layers` layers with a dense MLP of mlp_hidden, then `experts`
  routed experts of width expert_hidden, top_k per token, sigmoid router
  with an expert bias, and `shared_experts` shared ones. DiffusionGemma
  (gemma_config): Gemma 4's layers, every `global_every`-th global."""
  if arch not in ARCHS:
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
  if arch == GEMMA:
    return gemma_config(
        special_ids, vocab_size=vocab_size, layers=layers, d_model=d_model,
        heads=heads, kv_heads=kv_heads, mlp_hidden=mlp_hidden,
        rope_theta=rope_theta, max_seq_len=max_seq_len, dtype=dtype,
        experts=experts, top_k=top_k, expert_hidden=expert_hidden,
        sliding_window=sliding_window, global_every=global_every)
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


def gemma_config(special_ids: dict, *, vocab_size: int, layers: int,
                 d_model: int, heads: int, kv_heads: int | None,
                 mlp_hidden: int, rope_theta: float, max_seq_len: int,
                 dtype: str, experts: int, top_k: int, expert_hidden: int,
                 sliding_window: int, global_every: int) -> GemmaConfig:
  """A small DiffusionGemma with the published model's structure: local
  sliding-window layers (heads of d_model/heads, kv_heads, full RoPE of
  base rope_theta) and every `global_every`-th layer global (one K=V head
  of twice the size, RoPE on a quarter at base 1e6), query/key norms, an
  MoE of `experts` (top_k, width expert_hidden) beside a dense MLP of
  mlp_hidden, the self-conditioning MLP of mlp_hidden, final softcap 30.
  special_ids: tokenizer_builder.special_ids of a Gemma-id tokenizer."""
  if global_every < 1:
    raise ValueError(f"global_every must be >= 1, got {global_every}")
  kinds = tuple("global" if (i + 1) % global_every == 0 else "local"
                for i in range(layers))
  if special_ids.get("pad_token_id") != GEMMA4_SPECIAL["pad"]:
    raise ValueError("DiffusionGemma needs PAD at id 0 (its sampler writes "
                     "0 after an end token): build the tokenizer with "
                     "arch='diffusion_gemma'")
  head_dim = d_model // heads
  return GemmaConfig(
      vocab_size=vocab_size, d_model=d_model, mlp_hidden=mlp_hidden,
      sc_hidden=mlp_hidden, n_heads=heads, head_dim=head_dim,
      n_kv_heads=kv_heads or heads, layer_kinds=kinds,
      sliding_window=sliding_window, final_logit_softcap=30.0,
      n_global_kv_heads=1, global_head_dim=2 * head_dim, k_eq_v_global=True,
      global_rope_fraction=0.25, local_rope_base=rope_theta,
      global_rope_base=1_000_000.0, moe_experts=experts,
      moe_hidden=expert_hidden, moe_top_k=top_k,
      eos_token_id=special_ids["eos_token_id"],
      bos_token_id=special_ids["bos_token_id"],
      end_of_turn_id=special_ids["eot_token_id"],
      tool_response_id=GEMMA4_SPECIAL["begin_of_tool_response"],
      text_vocab_size=vocab_size, max_seq_len=max_seq_len, dtype=dtype)


def init_train_params(config, rng: jax.Array) -> dict:
  """Float32 initial weights. DiffusionGemma: dg_ckpt.init_params' normal
  draws, with the tied table ~N(0, 1/D) (unit inputs after the sqrt(D)
  scale, unit-scale logits) and the attention output ~N(0, 1/(N*H))."""
  if not isinstance(config, GemmaConfig):
    return init_params(config, rng, param_dtype="float32")
  flat = traverse_util.flatten_dict(
      dg_ckpt.init_params(config, rng, jnp.float32), sep="/")
  table = flat["embedder/input_embedding"]
  key = jax.random.fold_in(rng, 1)
  flat["embedder/input_embedding"] = jax.random.normal(
      key, table.shape, jnp.float32) / np.sqrt(config.d_model)
  for path, w in flat.items():
    if path.endswith("attn_vec_einsum/w"):
      n, h, _ = w.shape
      flat[path] = w * np.sqrt(h) / np.sqrt(n * h)
  return traverse_util.unflatten_dict(flat, sep="/")


def num_params(config) -> int:
  """Parameters of the model (DiffusionGemma: its text parameters)."""
  if isinstance(config, GemmaConfig):
    return sum(int(np.prod(s)) for s in dg_ckpt.param_shapes(config).values())
  return config.num_params()


def save_model(dst, params, config, tokenizer, force: bool = False) -> None:
  """The checkpoint `flash_dllm_jax.load` reads: DiffusionGemma in Google's
  format (orbax tree + config.json), the others in the converted format."""
  if isinstance(config, GemmaConfig):
    dg_ckpt.save(dst, params, config, tokenizer, force=force)
  else:
    save_converted(dst, params, config, tokenizer, force=force)
