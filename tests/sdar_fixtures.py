"""A tiny genuine-format SDAR Hugging Face directory, and the Qwen3 model of
the installed transformers over the same weights as the forward oracle.

Files, keys and tensor names follow JetLM/SDAR-8B-Chat (config.json's key
set with model_type `sdar` and auto_map, generation_config.json's two EOS
ids, sharded safetensors with model.safetensors.index.json, a byte-level BPE
tokenizer.json with <|endoftext|> = eos = pad, <|im_start|>, <|im_end|>,
<|MASK|> and tokenizer_config.json with the genuine chat template).
modeling_sdar.py's SDARForCausalLM is Qwen3ForCausalLM's layers (QK-norm
on each head before RoPE, no biases) run with the block-causal 4-D mask its
generate.py builds; transformers' Qwen3ForCausalLM given that mask computes
it (modeling_sdar.py itself needs flash-attn, not installed here).
SDAR-30B-A3B-Chat's directory (write_sdar_moe) is Qwen3-MoE's, its oracle
transformers' Qwen3MoeForCausalLM under the same mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flash_dllm_jax.architectures.sdar.chat import CHAT_TEMPLATE
from tests import llada2_fixtures

TOKENIZER_SIZE = 300
VOCAB = 320
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")


def build_tokenizer():
  """(tokenizers.Tokenizer, ids): llada2_fixtures' byte-level BPE with
  SDAR's special tokens on top."""
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
  return tok, dict(eos_token_id=t("<|endoftext|>"),
                   eot_token_id=t("<|im_end|>"), mask_token_id=t("<|MASK|>"))


def tiny_config(ids: dict[str, int], n_layers: int = 2) -> dict:
  """SDAR-8B-Chat's config.json keys at tiny sizes: hidden 32, 4 heads of 8
  over 2 kv heads, MLP 64."""
  here = Path(__file__).parent / "reference" / "sdar" / "sdar-8b-chat"
  config = json.loads((here / "config.json").read_text())
  config.update(
      hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      max_window_layers=n_layers, max_position_embeddings=512,
      vocab_size=VOCAB, bos_token_id=ids["eos_token_id"],
      eos_token_id=ids["eos_token_id"], mask_token_id=ids["mask_token_id"],
      torch_dtype="float32")
  return config


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape [out, in]} of an SDARForCausalLM checkpoint."""
  h, v, d = c["hidden_size"], c["vocab_size"], c["head_dim"]
  q, kv, f = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, \
      c["intermediate_size"]
  shapes = {"model.embed_tokens.weight": (v, h)}
  for layer in range(c["num_hidden_layers"]):
    p = f"model.layers.{layer}."
    shapes.update({
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.q_norm.weight": (d,),
        p + "self_attn.k_norm.weight": (d,),
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
  confident draws), 1 + N(0, 0.04) norm scales."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in tensor_shapes(config).items():
    noise = rng.standard_normal(shape)
    if name == "model.embed_tokens.weight":
      t = noise
    elif len(shape) == 2:
      t = noise * shape[1] ** -0.5 * (4.0 if name == "lm_head.weight" else 1)
    else:
      t = 1.0 + 0.2 * noise
    out[name] = t.astype(np.float32)
  return out


def write_sdar(path: str | Path, seed: int = 0, n_layers: int = 2):
  """Writes the tiny directory; returns (path, weights, config)."""
  path = Path(path)
  path.mkdir(parents=True)
  tok, ids = build_tokenizer()
  config = tiny_config(ids, n_layers)
  weights = random_weights(config, seed)
  llada2_fixtures.write_shards(path, weights, 2, seed)
  _write_json(path / "config.json", config)
  write_tokenizer_files(path, tok, ids)
  return path, weights, config


def _write_json(path: Path, data):
  path.write_text(json.dumps(data, indent=2) + "\n")


def write_tokenizer_files(path: Path, tok, ids, template_file=False):
  """generation_config.json and the tokenizer of the genuine directories;
  `template_file`: the chat template in chat_template.jinja (as
  SDAR-30B-A3B-Chat ships it), not in tokenizer_config.json."""
  _write_json(path / "generation_config.json", {
      "bos_token_id": ids["eos_token_id"], "do_sample": True,
      "eos_token_id": [ids["eot_token_id"], ids["eos_token_id"]],
      "pad_token_id": ids["eos_token_id"], "temperature": 0.6,
      "top_k": 20, "top_p": 0.95})
  tok.save(str(path / "tokenizer.json"))
  config = {
      "add_bos_token": False, "add_prefix_space": False,
      "additional_special_tokens": list(SPECIALS[1:]), "bos_token": None,
      "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
      "eos_token": "<|endoftext|>", "mask_token": "<|MASK|>",
      "model_max_length": 131072, "pad_token": "<|endoftext|>",
      "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
  if template_file:
    (path / "chat_template.jinja").write_text(config.pop("chat_template"))
  _write_json(path / "tokenizer_config.json", config)


def tiny_moe_config(ids: dict[str, int]) -> dict:
  """SDAR-30B-A3B-Chat's config.json keys (no mask_token_id: the tokenizer
  names it) at tiny sizes: 2 layers, layer 0 dense (mlp_only_layers), 8
  experts of width 16, top 2."""
  here = Path(__file__).parent / "reference" / "sdar" / "sdar-30b-a3b-chat"
  config = json.loads((here / "config.json").read_text())
  config.update(
      hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      max_window_layers=2, max_position_embeddings=512, vocab_size=VOCAB,
      moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
      mlp_only_layers=[0], bos_token_id=ids["eos_token_id"],
      eos_token_id=ids["eos_token_id"], torch_dtype="float32")
  return config


def write_sdar_moe(path: str | Path, seed: int = 0):
  """The tiny SDAR-30B-A3B-Chat directory: transformers' Qwen3MoeForCausalLM
  (the genuine modeling_sdar_moe.py's layers: Qwen3-MoE of transformers
  4.52) holding random_weights' draws (router rows N(0, 1/fan_in)), saved
  by save_pretrained in shards, with the genuine config.json key set.
  Returns (path, the torch model (float32, eager), config.json dict)."""
  import torch
  from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
  path = Path(path)
  tok, ids = build_tokenizer()
  config = tiny_moe_config(ids)
  keys = ("vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
          "tie_word_embeddings", "attention_bias", "decoder_sparse_step",
          "moe_intermediate_size", "num_experts", "num_experts_per_tok",
          "norm_topk_prob", "mlp_only_layers")
  model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
      **{k: config[k] for k in keys}, attn_implementation="eager")).eval()
  rng = np.random.default_rng(seed)
  state = {}
  for name, t in model.state_dict().items():
    shape, noise = tuple(t.shape), rng.standard_normal(tuple(t.shape))
    if name == "model.embed_tokens.weight":
      v = noise
    elif len(shape) == 2:
      v = noise * shape[1] ** -0.5 * (4.0 if name == "lm_head.weight" else 1)
    else:
      v = 1.0 + 0.2 * noise
    state[name] = torch.from_numpy(v.astype(np.float32))
  model.load_state_dict(state)
  model.save_pretrained(path, max_shard_size="40KB")
  _write_json(path / "config.json", config)
  write_tokenizer_files(path, tok, ids, template_file=True)
  return path, model, config


def block_mask(n: int, block_length: int | None):
  """[n, n] bool, generate.py's block_diffusion_attention_mask (tril over
  blocks from position 0); None: full attention."""
  if block_length is None:
    return np.ones((n, n), bool)
  blocks = np.arange(n) // block_length
  return blocks[None, :] <= blocks[:, None]


def torch_model(weights: dict, config: dict):
  """transformers' Qwen3ForCausalLM (float32, eager attention) holding the
  weights."""
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM
  keys = ("vocab_size", "hidden_size", "intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
          "tie_word_embeddings", "attention_bias")
  qwen = Qwen3Config(**{k: config[k] for k in keys},
                     attn_implementation="eager")
  model = Qwen3ForCausalLM(qwen).eval()
  model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
  return model


def torch_logits(model, ids: np.ndarray, block_length: int | None
                 ) -> np.ndarray:
  """[B, N, V] logits of ids [B, N] at positions arange(N) under the
  block-causal mask (an additive 4-D float mask, as modeling_sdar.py turns
  its bool mask into for SDPA)."""
  import torch
  n = ids.shape[1]
  allowed = torch.from_numpy(block_mask(n, block_length))
  bias = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32)
                                       .min)[None, None]
  with torch.no_grad():
    out = model(torch.from_numpy(np.asarray(ids, np.int64)),
                attention_mask=bias.expand(ids.shape[0], 1, n, n),
                position_ids=torch.arange(n)[None].expand(ids.shape[0], n))
  return out.logits.numpy()


def check_forward(model, oracle, block_length) -> None:
  """The model's logits equal `oracle`'s (torch_logits) under the block mask
  (float32), also with left padding: positions and blocks count from a
  row's first token."""
  import flash_dllm_jax as fdj
  ids = np.random.default_rng(0).integers(0, 290, (2, 13))
  want = torch_logits(oracle, ids, block_length)
  got = fdj.logits(model, ids, block_length=block_length).logits_BxNxV
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=3e-5)
  padded = np.concatenate([np.zeros((2, 3), np.int64), ids], axis=1)
  valid = np.arange(16)[None].repeat(2, 0) >= 3
  got = fdj.logits(model, padded, valid=valid,
                   block_length=block_length).logits_BxNxV
  np.testing.assert_allclose(np.asarray(got)[:, 3:], want, rtol=0, atol=3e-5)


def check_conversions(hf_dir, model, tmp_path, block_length):
  """An HF directory converts bit for bit (float32) and to int8 weights
  within 5% of the logits; returns the int8 (params, config)."""
  import flash_dllm_jax as fdj
  from flash_dllm_jax.convert import convert_checkpoint
  convert_checkpoint(hf_dir, tmp_path / "f32", dtype="float32", progress=False)
  convert_checkpoint(hf_dir, tmp_path / "int8", dtype="float32",
                     quantize="int8", progress=False)
  ids = np.random.default_rng(2).integers(0, 290, (2, 12))
  bl = block_length
  ref = np.asarray(fdj.logits(model, ids, block_length=bl).logits_BxNxV)
  got = fdj.logits(fdj.load(tmp_path / "f32"), ids, block_length=bl)
  np.testing.assert_array_equal(np.asarray(got.logits_BxNxV), ref)
  params, config, _ = fdj.load(tmp_path / "int8")
  assert config.quantize == "int8"
  got = np.asarray(fdj.logits((params, config, None), ids,
                              block_length=bl).logits_BxNxV)
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.05
  return params, config
