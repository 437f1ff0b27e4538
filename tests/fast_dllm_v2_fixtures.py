"""A tiny genuine-format Fast-dLLM v2 Hugging Face directory, and the Qwen2
model of the installed transformers over the same weights as the forward
oracle.

Files, keys and tensor names follow Efficient-Large-Model/Fast_dLLM_v2_7B
(config.json's key set with model_type `Fast_dLLM_Qwen`, auto_map and
bd_size; generation_config.json; sharded safetensors with
model.safetensors.index.json; a byte-level BPE tokenizer.json with
<|endoftext|> = pad, <|im_start|>, <|im_end|> = eos and |<MASK>|, and
tokenizer_config.json with the genuine chat template). One deviation: the
tiny tokenizer_config.json names `mask_token` (the genuine one does not,
its mask id being the remote code's constant 151665, outside a tiny
vocabulary). modeling.py's Fast_dLLM_QwenForCausalLM at inference is
Qwen2's layers (q/k/v biases, no QK-norm) under the block-causal mask
eval_block_diff_mask builds; transformers' Qwen2ForCausalLM given that
mask computes it (the remote code needs flex attention and einops).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flash_dllm_jax.architectures.qwen2_chat import CHAT_TEMPLATE
from tests import llada2_fixtures
from tests.sdar_fixtures import block_mask

TOKENIZER_SIZE = 300
VOCAB = 320
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|")
REFERENCE = (Path(__file__).parent / "reference" / "fast_dllm_v2"
             / "fast-dllm-v2-7b")


def build_tokenizer():
  """(tokenizers.Tokenizer, ids): llada2_fixtures' byte-level BPE with
  Fast-dLLM v2's special tokens on top."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, \
      pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  n_base = TOKENIZER_SIZE - len(SPECIALS)
  tok.train_from_iterator(
      llada2_fixtures._CORPUS.splitlines(keepends=True),
      trainers.BpeTrainer(vocab_size=n_base, show_progress=False,
                          initial_alphabet=pre_tokenizers.ByteLevel
                          .alphabet()))
  fillers = [f"<|reserved_token_{i}|>"
             for i in range(n_base - tok.get_vocab_size())]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in fillers + list(SPECIALS)])
  t = tok.token_to_id
  return tok, dict(pad_token_id=t("<|endoftext|>"),
                   eos_token_id=t("<|im_end|>"), mask_token_id=t("|<MASK>|"))


def tiny_config(ids: dict[str, int], n_layers: int = 2) -> dict:
  """Fast_dLLM_v2_7B's config.json keys at tiny sizes: hidden 32, 4 heads
  of 8 over 2 kv heads, MLP 64."""
  config = json.loads((REFERENCE / "config.json").read_text())
  config.update(
      hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
      num_attention_heads=4, num_key_value_heads=2,
      layer_types=["full_attention"] * n_layers, max_window_layers=n_layers,
      max_position_embeddings=512, vocab_size=VOCAB,
      bos_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"],
      pad_token_id=ids["eos_token_id"], torch_dtype="float32")
  return config


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape [out, in]} of a Fast_dLLM_QwenForCausalLM."""
  h, v, n = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
  d = h // n
  q, kv, f = n * d, c["num_key_value_heads"] * d, c["intermediate_size"]
  shapes = {"model.embed_tokens.weight": (v, h)}
  for layer in range(c["num_hidden_layers"]):
    p = f"model.layers.{layer}."
    shapes.update({
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.q_proj.bias": (q,),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.k_proj.bias": (kv,),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.v_proj.bias": (kv,),
        p + "self_attn.o_proj.weight": (h, q),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (f, h),
        p + "mlp.up_proj.weight": (f, h),
        p + "mlp.down_proj.weight": (h, f)})
  shapes["model.norm.weight"] = (h,)
  shapes["lm_head.weight"] = (v, h)
  return shapes


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """float32: N(0, 1) embeddings, N(0, 1/fan_in) matrices (the head 4x, for
  confident draws), N(0, 0.04) biases, 1 + N(0, 0.04) norm scales."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in tensor_shapes(config).items():
    noise = rng.standard_normal(shape)
    if name == "model.embed_tokens.weight":
      t = noise
    elif len(shape) == 2:
      t = noise * shape[1] ** -0.5 * (4.0 if name == "lm_head.weight" else 1)
    elif name.endswith(".bias"):
      t = 0.2 * noise
    else:
      t = 1.0 + 0.2 * noise
    out[name] = t.astype(np.float32)
  return out


def write_fast_dllm_v2(path: str | Path, seed: int = 0, n_layers: int = 2,
                       stop_like: int | None = None):
  """Writes the tiny directory; returns (path, weights, config). stop_like:
  a token whose head row, times 1.05, becomes the stop id's (<|im_end|>), so
  that answers end where that token would be drawn."""
  path = Path(path)
  path.mkdir(parents=True)
  tok, ids = build_tokenizer()
  config = tiny_config(ids, n_layers)
  weights = random_weights(config, seed)
  if stop_like is not None:
    head = weights["lm_head.weight"]
    head[ids["eos_token_id"]] = 1.05 * head[stop_like]
  llada2_fixtures.write_shards(path, weights, 2, seed)
  dump = lambda name, data: (path / name).write_text(
      json.dumps(data, indent=2) + "\n")
  dump("config.json", config)
  dump("generation_config.json", {
      "bos_token_id": ids["pad_token_id"], "do_sample": True,
      "eos_token_id": [ids["eos_token_id"], ids["pad_token_id"]],
      "pad_token_id": ids["pad_token_id"], "repetition_penalty": 1.05,
      "temperature": 0.7, "top_k": 20, "top_p": 0.8})
  tok.save(str(path / "tokenizer.json"))
  dump("tokenizer_config.json", {
      "add_bos_token": False, "add_prefix_space": False,
      "additional_special_tokens": ["|<MASK>|"], "bos_token": None,
      "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
      "eos_token": "<|im_end|>", "mask_token": "|<MASK>|",
      "model_max_length": 131072, "pad_token": "<|endoftext|>",
      "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
  return path, weights, config


def torch_model(weights: dict, config: dict):
  """transformers' Qwen2ForCausalLM (float32, eager attention) holding the
  weights."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM
  keys = ("vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "rms_norm_eps", "rope_theta", "max_position_embeddings",
          "tie_word_embeddings")
  qwen = Qwen2Config(**{k: config[k] for k in keys},
                     attn_implementation="eager")
  model = Qwen2ForCausalLM(qwen).eval()
  model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
  return model


def torch_window(model, ids: np.ndarray, block_length: int):
  """(logits [N, V], [(K, V)] per layer [1, kv heads, N, head dim]) of one
  row ids [N] at positions arange(N) under the block-causal mask."""
  import torch
  n = len(ids)
  allowed = torch.from_numpy(block_mask(n, block_length))
  bias = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32)
                                       .min)[None, None]
  with torch.no_grad():
    out = model(torch.from_numpy(np.asarray(ids, np.int64))[None],
                attention_mask=bias, position_ids=torch.arange(n)[None],
                use_cache=True)
  return out.logits[0].numpy(), list(out.past_key_values.to_legacy_cache())


def torch_sub_block(model, kv, sub_ids, first: int):
  """(logits [S, V], [(K, V)] of the sub-block) of tokens sub_ids [S] at
  positions first.. attending to every cached key of kv (per layer (K, V)
  [1, kv heads, C, head dim]) and to each other: the remote code's
  sub-block forward against its block cache."""
  import torch
  from transformers import DynamicCache
  s, c = len(sub_ids), kv[0][0].shape[2]
  cache = DynamicCache.from_legacy_cache(tuple(kv))
  with torch.no_grad():
    out = model(torch.from_numpy(np.asarray(sub_ids, np.int64))[None],
                attention_mask=torch.zeros(1, 1, s, c + s),
                position_ids=torch.arange(first, first + s)[None],
                past_key_values=cache, use_cache=True)
  new = [(k[:, :, c:], v[:, :, c:])
         for k, v in out.past_key_values.to_legacy_cache()]
  return out.logits[0].numpy(), new

