"""A tiny genuine-format LLaDA2.x (llada2_moe) Hugging Face directory.

Files, keys and tensor names follow inclusionAI/LLaDA2.0-mini and
LLaDA2.1-mini: config.json with the genuine key set and auto_map, random
weights under the genuine names in sharded safetensors with
model.safetensors.index.json (expert_bias kept float32 as in the real
checkpoint), and a byte-level BPE tokenizer.json with the genuine special
tokens (<|startoftext|>, <|endoftext|> = eos = pad, <|mask|>, <|role_end|>)
plus tokenizer_config.json carrying the Ling-style chat template.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from flash_dllm_jax.architectures.llada2 import chat as llada2_chat

TOKENIZER_SIZE = 300  # ids the tokenizer knows; the embedding is padded
VOCAB = 320
SPECIALS = ("<role>", "</role>", "<|startoftext|>", "<|endoftext|>",
            "<|role_end|>", "<|mask|>")

# The chat format the engine's llada2 folder holds (the inclusionAI examples'
# prompt form): the tokenizer_config.json written here carries it.
CHAT_TEMPLATE = llada2_chat.CHAT_TEMPLATE

_CORPUS = """The quick brown fox jumps over the lazy dog.
A diffusion language model fills masked positions block by block.
def add(a, b):
    return a + b
Question: what is 12 plus 30? Answer: 42.
Mixture of experts route each token to a few experts and one shared one.
"""


def tiny_config(ids: dict[str, int], n_layers: int = 2) -> dict:
  """config.json with the genuine LLaDA2.x key set at tiny sizes: hidden 32,
  4 heads of 8 over 2 kv heads, layer 0 dense, then 8 experts (top 2 of 2
  groups, 1 group kept) with 1 shared expert."""
  return {
      "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
      "auto_map": {
          "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
          "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
          "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
      "dtype": "float32", "embedding_dropout": 0.0,
      "first_k_dense_replace": 1, "head_dim": 8, "hidden_act": "silu",
      "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
      "max_position_embeddings": 512, "max_window_layers": 28,
      "model_type": "llada2_moe", "moe_intermediate_size": 16,
      "moe_router_enable_expert_bias": True, "n_group": 2,
      "norm_head": False, "norm_softmax": False, "norm_topk_prob": True,
      "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
      "num_hidden_layers": n_layers, "num_key_value_heads": 2,
      "num_shared_experts": 1, "output_dropout": 0.0,
      "output_router_logits": False, "pad_token_id": ids["pad_token_id"],
      "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06,
      "rope_scaling": None, "rope_theta": 600000, "rotary_dim": 4,
      "routed_scaling_factor": 2.5, "router_dtype": "fp32",
      "score_function": "sigmoid", "sliding_window": 4096,
      "tie_word_embeddings": False, "topk_group": 1,
      "transformers_version": "4.57.1", "use_bias": False,
      "use_cache": False, "use_qkv_bias": False, "use_rmsnorm": True,
      "use_sliding_window": False,
      "using_split_qkv_in_self_attention": False, "vocab_size": VOCAB}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape [out, in]} of a LLaDA2MoeModelLM checkpoint, in
  module order (embedding, layers, final norm, lm_head)."""
  c = config
  h, v, d = c["hidden_size"], c["vocab_size"], c.get("head_dim") or (
      c["hidden_size"] // c["num_attention_heads"])
  nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
  shapes = {"model.word_embeddings.weight": (v, h)}

  def mlp(prefix, width):
    shapes.update({prefix + "gate_proj.weight": (width, h),
                   prefix + "up_proj.weight": (width, h),
                   prefix + "down_proj.weight": (h, width)})

  for layer in range(c["num_hidden_layers"]):
    p = f"model.layers.{layer}."
    shapes[p + "input_layernorm.weight"] = (h,)
    shapes[p + "attention.query_key_value.weight"] = ((nh + 2 * nkv) * d, h)
    if c.get("use_qkv_bias"):
      shapes[p + "attention.query_key_value.bias"] = ((nh + 2 * nkv) * d,)
    if c.get("use_qk_norm", True):
      shapes[p + "attention.query_layernorm.weight"] = (d,)
      shapes[p + "attention.key_layernorm.weight"] = (d,)
    shapes[p + "attention.dense.weight"] = (h, nh * d)
    if c.get("use_bias", True):
      shapes[p + "attention.dense.bias"] = (h,)
    shapes[p + "post_attention_layernorm.weight"] = (h,)
    if c["num_experts"] is None or layer < c["first_k_dense_replace"]:
      mlp(p + "mlp.", c["intermediate_size"])
      continue
    shapes[p + "mlp.gate.weight"] = (c["num_experts"], h)
    shapes[p + "mlp.gate.expert_bias"] = (c["num_experts"],)
    for e in range(c["num_experts"]):
      mlp(f"{p}mlp.experts.{e}.", c["moe_intermediate_size"])
    if c["num_shared_experts"]:
      mlp(p + "mlp.shared_experts.",
          c["moe_intermediate_size"] * c["num_shared_experts"])
  shapes["model.norm.weight"] = (h,)
  shapes["lm_head.weight"] = (v, h)
  return shapes


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """float32 weights with clear margins: N(0, 1) embeddings, N(0, 1/fan_in)
  matrices (the router 3x that, so routing is decisive), 1 + N(0, 0.04) norm
  scales and N(0, 0.01) expert biases."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in tensor_shapes(config).items():
    noise = rng.standard_normal(shape)
    if name == "model.word_embeddings.weight":
      t = noise
    elif name.endswith("expert_bias"):
      t = 0.1 * noise
    elif name.endswith("gate.weight"):
      t = 3.0 * noise * shape[1] ** -0.5
    elif len(shape) == 2:
      t = noise * shape[1] ** -0.5
    elif name.endswith(".bias"):
      t = 0.5 * noise
    else:
      t = 1.0 + 0.2 * noise
    out[name] = t.astype(np.float32)
  return out


def build_tokenizer():
  """(tokenizers.Tokenizer, ids): byte-level BPE over a built-in snippet,
  reserved fillers up to TOKENIZER_SIZE with the special tokens on top."""
  from tokenizers import (AddedToken, Tokenizer, decoders, models,
                          pre_tokenizers, trainers)
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  n_base = TOKENIZER_SIZE - len(SPECIALS)
  tok.train_from_iterator(_CORPUS.splitlines(keepends=True),
                          trainers.BpeTrainer(
                              vocab_size=n_base, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel
                              .alphabet()))
  fillers = [f"<|reserved_token_{i}|>"
             for i in range(n_base - tok.get_vocab_size())]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in fillers + list(SPECIALS)])
  token = tok.token_to_id
  ids = dict(bos_token_id=token("<|startoftext|>"),
             eos_token_id=token("<|endoftext|>"),
             pad_token_id=token("<|endoftext|>"),
             mask_token_id=token("<|mask|>"),
             eot_token_id=token("<|role_end|>"))
  return tok, ids


def _write_json(path: Path, data) -> None:
  path.write_text(json.dumps(data, indent=2) + "\n")


def write_shards(path: Path, tensors: dict[str, np.ndarray], n_shards: int,
                 seed: int = 0, dtype: str = "float32") -> None:
  """model-0000k-of-0000n.safetensors plus model.safetensors.index.json;
  expert_bias stays float32 whatever `dtype` is, as in the real files."""
  import torch
  from safetensors.torch import save_file
  names = sorted(tensors)
  random.Random(seed).shuffle(names)
  shard_of = {n: f"model-{i % n_shards + 1:05d}-of-{n_shards:05d}"
                 ".safetensors" for i, n in enumerate(names)}

  def as_torch(name):
    t = torch.from_numpy(np.ascontiguousarray(tensors[name]))
    return t if name.endswith("expert_bias") else t.to(getattr(torch, dtype))

  total = 0
  for shard in sorted(set(shard_of.values())):
    part = {n: as_torch(n) for n, s in shard_of.items() if s == shard}
    total += sum(t.numel() * t.element_size() for t in part.values())
    save_file(part, str(path / shard), metadata={"format": "pt"})
  _write_json(path / "model.safetensors.index.json", {
      "metadata": {"total_size": total},
      "weight_map": dict(sorted(shard_of.items()))})


def write_llada2(path: str | Path, seed: int = 0, n_layers: int = 2,
                 n_shards: int = 2, dtype: str = "float32"):
  """Writes the tiny directory; returns (path, weights, config)."""
  path = Path(path)
  path.mkdir(parents=True)
  tok, ids = build_tokenizer()
  config = tiny_config(ids, n_layers)
  config["dtype"] = dtype
  weights = random_weights(config, seed)
  write_shards(path, weights, n_shards, seed, dtype)
  _write_json(path / "config.json", config)
  _write_json(path / "generation_config.json", {
      "eos_token_id": ids["eos_token_id"], "pad_token_id": ids["pad_token_id"],
      "do_sample": False, "transformers_version": "4.57.1"})
  tok.save(str(path / "tokenizer.json"))
  _write_json(path / "tokenizer_config.json", {
      "add_bos_token": False, "add_eos_token": False,
      "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
      "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
      "clean_up_tokenization_spaces": False, "model_max_length": 32768,
      "tokenizer_class": "PreTrainedTokenizerFast"})
  _write_json(path / "special_tokens_map.json", {
      "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
      "pad_token": "<|endoftext|>"})
  return path, weights, config
