"""Tiny genuine-format Hugging Face checkpoints of LLaDA and Dream for tests.

The weights come from an independent oracle: a randomly initialised
transformers `LlamaForCausalLM` (LLaDA is a bidirectional Llama without
biases) or `Qwen2ForCausalLM` (Dream), with large-scale weights (N(0, 1/fan_in)
kernels, N(0, 1) embeddings) so that logits have clear margins. Files, keys and
tensor names follow the genuine repositories: LLaDA ships tokenizer.json,
Dream only vocab.json + merges.txt + added_tokens.json.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

from flash_dllm_jax.tokenizer import build_tiny_tokenizer

VOCAB = 384
D_MODEL, N_HEADS, N_KV_HEADS, HEAD_DIM, MLP_HIDDEN = 64, 4, 2, 16, 128
MAX_LEN = 512

# Llama name -> LLaDA name.
_LLADA_TOP = {"model.embed_tokens.weight": "model.transformer.wte.weight",
              "model.norm.weight": "model.transformer.ln_f.weight",
              "lm_head.weight": "model.transformer.ff_out.weight"}
_LLADA_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "q_proj",
                "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
                "self_attn.o_proj": "attn_out",
                "post_attention_layernorm": "ff_norm",
                "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj",
                "mlp.down_proj": "ff_out"}


def llada_name(llama_name: str) -> str:
  if llama_name in _LLADA_TOP:
    return _LLADA_TOP[llama_name]
  layer, module = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight",
                               llama_name).groups()
  return f"model.transformer.blocks.{layer}.{_LLADA_BLOCK[module]}.weight"


def _randomize_(model: torch.nn.Module, seed: int) -> None:
  """Large-scale weights: N(0,1) embeddings, N(0, 1/fan_in) matrices,
  N(0, 0.25) biases, 1 + N(0, 0.04) norm scales."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      if "embed_tokens" in name:
        p.copy_(noise)
      elif p.ndim == 2:
        p.copy_(noise * p.shape[1] ** -0.5)
      elif name.endswith("bias"):
        p.copy_(noise * 0.5)
      else:
        p.copy_(1.0 + 0.2 * noise)


def _write_shards(path: Path, tensors: dict[str, torch.Tensor], n_shards: int,
                  seed: int) -> None:
  """Scatters tensors over model-0000k-of-0000n shards plus the index."""
  names = sorted(tensors)
  random.Random(seed).shuffle(names)
  shard_of = {name: f"model-{i % n_shards + 1:05d}-of-{n_shards:05d}"
                    ".safetensors" for i, name in enumerate(names)}
  for shard in sorted(set(shard_of.values())):
    save_file({n: tensors[n].contiguous() for n, s in shard_of.items()
               if s == shard}, str(path / shard), metadata={"format": "pt"})
  total = sum(t.numel() * t.element_size() for t in tensors.values())
  index = {"metadata": {"total_size": total},
           "weight_map": dict(sorted(shard_of.items()))}
  _write_json(path / "model.safetensors.index.json", index)


def _write_json(path: Path, data) -> None:
  path.write_text(json.dumps(data, indent=2))


def write_llada(path: str | Path, seed: int = 0, n_layers: int = 2,
                n_shards: int = 3, dtype: str = "float32"):
  """A tiny LLaDA-8B-Instruct-format directory; returns (path, oracle)."""
  path = Path(path)
  path.mkdir(parents=True)
  tokenizer, ids = build_tiny_tokenizer("llada", VOCAB)
  oracle = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=MLP_HIDDEN,
      num_hidden_layers=n_layers, num_attention_heads=N_HEADS,
      num_key_value_heads=N_KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=1e-5,
      rope_theta=500000.0, max_position_embeddings=MAX_LEN,
      attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
      attn_implementation="eager")).eval()
  _randomize_(oracle, seed)
  tensors = {llada_name(n): t.to(getattr(torch, dtype))
             for n, t in oracle.state_dict().items()}
  _write_shards(path, tensors, n_shards, seed)
  _write_json(path / "config.json", {
      "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
      "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0,
      "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
      "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                   "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                   "AutoModel": "modeling_llada.LLaDAModelLM"},
      "bias_for_layer_norm": False, "block_group_size": 1,
      "block_type": "llama", "d_model": D_MODEL, "embedding_dropout": 0.0,
      "embedding_size": VOCAB, "eos_token_id": ids["eos_token_id"],
      "flash_attention": False, "include_bias": False,
      "include_qkv_bias": False, "init_cutoff_factor": None,
      "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
      "input_emb_norm": False, "layer_norm_type": "rms",
      "layer_norm_with_affine": True, "mask_token_id": ids["mask_token_id"],
      "max_sequence_length": MAX_LEN, "mlp_hidden_size": MLP_HIDDEN,
      "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
      "n_heads": N_HEADS, "n_kv_heads": N_KV_HEADS, "n_layers": n_layers,
      "pad_token_id": ids["pad_token_id"], "precision": "amp_bf16",
      "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
      "rope_full_precision": True, "rope_theta": 500000.0,
      "scale_logits": False, "transformers_version": "4.46.3",
      "use_cache": False, "vocab_size": VOCAB, "weight_tying": False})
  _write_json(path / "generation_config.json", {
      "_from_model_config": True, "bos_token_id": ids["bos_token_id"],
      "eos_token_id": ids["eos_token_id"], "transformers_version": "4.38.2"})
  tokenizer.save(path)
  return path, oracle


def write_dream(path: str | Path, seed: int = 0, n_layers: int = 3,
                n_shards: int = 2, dtype: str = "float32"):
  """A tiny Dream-v0-Instruct-7B-format directory; returns (path, oracle)."""
  path = Path(path)
  path.mkdir(parents=True)
  tokenizer, ids = build_tiny_tokenizer("dream", VOCAB)
  oracle = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=MLP_HIDDEN,
      num_hidden_layers=n_layers, num_attention_heads=N_HEADS,
      num_key_value_heads=N_KV_HEADS, rms_norm_eps=1e-6, rope_theta=1e6,
      max_position_embeddings=MAX_LEN, use_sliding_window=False,
      tie_word_embeddings=False, attn_implementation="eager")).eval()
  _randomize_(oracle, seed)
  tensors = {n: t.to(getattr(torch, dtype))
             for n, t in oracle.state_dict().items()}
  _write_shards(path, tensors, n_shards, seed)
  eos = ids["eos_token_id"]
  _write_json(path / "config.json", {
      "architectures": ["DreamModel"], "attention_dropout": 0.0,
      "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                   "AutoModel": "modeling_dream.DreamModel"},
      "bos_token_id": eos, "eos_token_id": eos, "hidden_act": "silu",
      "hidden_size": D_MODEL, "initializer_range": 0.02,
      "intermediate_size": MLP_HIDDEN, "mask_token_id": ids["mask_token_id"],
      "max_position_embeddings": MAX_LEN, "max_window_layers": n_layers,
      "model_type": "Dream", "num_attention_heads": N_HEADS,
      "num_hidden_layers": n_layers, "num_key_value_heads": N_KV_HEADS,
      "pad_token_id": eos, "rms_norm_eps": 1e-06, "rope_scaling": None,
      "rope_theta": 1000000.0, "sliding_window": None,
      "tie_word_embeddings": False, "torch_dtype": dtype,
      "transformers_version": "4.46.2", "use_cache": True, "use_mrope": False,
      "use_sliding_window": False, "vocab_size": VOCAB})
  _write_json(path / "generation_config.json", {
      "_from_model_config": True, "alg": "origin", "alg_temp": None,
      "bos_token_id": eos, "eos_token_id": eos, "eps": 0.001,
      "mask_token_id": None, "output_history": False, "pad_token_id": eos,
      "steps": 512, "temperature": 0.0, "top_k": None, "top_p": None,
      "transformers_version": "4.46.2"})
  write_qwen2_tokenizer_files(tokenizer, path)
  return path, oracle


def write_qwen2_tokenizer_files(tokenizer, path: Path) -> None:
  """Dream's tokenizer files: vocab.json + merges.txt, added tokens in
  tokenizer_config.json and added_tokens.json, and no tokenizer.json."""
  tokenizer.save(path)
  (path / "tokenizer.json").unlink()
  tokenizer.backend.model.save(str(path))
  config = json.loads((path / "tokenizer_config.json").read_text())
  config.update(tokenizer_class="DreamTokenizer", errors="replace",
                auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer",
                                            None]},
                split_special_tokens=False, add_prefix_space=False)
  _write_json(path / "tokenizer_config.json", config)
  _write_json(path / "added_tokens.json", {
      t["content"]: int(i) for i, t in config["added_tokens_decoder"].items()})


def oracle_logits(oracle: torch.nn.Module, tokens_BxN) -> np.ndarray:
  """The oracle's float32 logits, run bidirectionally: an all-zero additive
  4-D mask [B, 1, N, N] replaces the causal one."""
  ids_BxN = torch.as_tensor(np.asarray(tokens_BxN), dtype=torch.long)
  b, n = ids_BxN.shape
  with torch.no_grad():
    out = oracle(input_ids=ids_BxN, attention_mask=torch.zeros(b, 1, n, n))
  return out.logits.float().numpy()
