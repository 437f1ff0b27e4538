"""Checks of the LLaDA2.x oracles: the NumPy forward against transformers'
Qwen3 (dense layers, full rotary) and DeepseekV3 (the same sigmoid
group-limited router), its block-causal mask, the generate restatements on
toy logits, the tiny genuine-format directory and the real mini's tensor
list."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from tests import llada2_fixtures as fx
from tests import llada2_numpy as ln
from tests import llada2_reference as lr

MINI = Path(__file__).parent / "reference" / "llada2-mini"


@pytest.fixture(scope="module")
def tiny():
  tok, ids = fx.build_tokenizer()
  cfg = fx.tiny_config(ids)
  return fx.random_weights(cfg, seed=1), cfg, ids


def test_tiny_directory_is_genuine_format(tmp_path):
  path, weights, cfg = fx.write_llada2(tmp_path / "m", seed=2)
  config = json.loads((path / "config.json").read_text())
  assert config["model_type"] == "llada2_moe"
  assert config["architectures"] == ["LLaDA2MoeModelLM"]
  assert config["auto_map"]["AutoModelForCausalLM"] == (
      "modeling_llada2_moe.LLaDA2MoeModelLM")
  index = json.loads((path / "model.safetensors.index.json").read_text())
  assert set(index["weight_map"]) == set(fx.tensor_shapes(config))
  assert len(set(index["weight_map"].values())) == 2
  seen = {}
  for shard in set(index["weight_map"].values()):
    with safe_open(str(path / shard), "np") as f:
      for name in f.keys():
        assert index["weight_map"][name] == shard
        seen[name] = f.get_tensor(name)
  assert seen.keys() == weights.keys()
  for name, t in seen.items():
    np.testing.assert_array_equal(t, weights[name])
  assert seen["model.layers.1.mlp.gate.expert_bias"].dtype == np.float32
  assert seen["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (32,
                                                                         16)
  assert "model.layers.0.mlp.gate.weight" not in seen  # layer 0 is dense


def test_tiny_tokenizer_loads_with_chat_template(tmp_path):
  path, _, config = fx.write_llada2(tmp_path / "m")
  tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(path))
  _, ids = fx.build_tokenizer()
  assert tok.eos_token_id == ids["eos_token_id"] == config["pad_token_id"]
  assert tok.convert_tokens_to_ids("<|mask|>") == ids["mask_token_id"]
  assert len(tok) == fx.TOKENIZER_SIZE < config["vocab_size"]
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                 tokenize=False, add_generation_prompt=True)
  assert text == ("<role>SYSTEM</role>detailed thinking off<|role_end|>"
                  "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>")
  enc = tok(text, add_special_tokens=False)["input_ids"]
  assert enc.count(ids["eot_token_id"]) == 2
  assert tok.decode(tok("a + b = 42")["input_ids"]) == "a + b = 42"


def test_mini_reference_tensor_list_matches_naming_rules():
  config = json.loads((MINI / "config.json").read_text())
  rows = [line.split() for line in
          (MINI / "tensors.txt").read_text().splitlines()]
  shapes = fx.tensor_shapes(config)
  assert [r[0] for r in rows] == list(shapes)
  assert all(tuple(map(int, r[2].split(","))) == shapes[r[0]] for r in rows)
  assert len(rows) == 14813  # the genuine index's tensor count
  # genuine total_size: bf16 everywhere, expert_bias float32
  size = sum(np.prod(tuple(map(int, s.split(",")))) * (4 if d == "F32" else 2)
             for _, d, s in rows)
  assert size == 32511296512
  assert ln.rotary_dim(ln.resolve_config(config)) == config["rotary_dim"]


def _qwen3_as_llada2(n_layers=2):
  qc = transformers.Qwen3Config(
      vocab_size=fx.VOCAB, hidden_size=32, intermediate_size=64,
      num_hidden_layers=n_layers, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
      rope_theta=600000.0, attention_bias=False, tie_word_embeddings=False,
      attn_implementation="eager")
  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(qc).eval().double()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.ndim == 2
                                     else 0.2) + (p.ndim == 1))
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  w = {"model.word_embeddings.weight": sd["model.embed_tokens.weight"],
       "model.norm.weight": sd["model.norm.weight"],
       "lm_head.weight": sd["lm_head.weight"]}
  for i in range(n_layers):
    p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    w[p + "attention.query_key_value.weight"] = np.concatenate(
        [sd[a + "q_proj.weight"], sd[a + "k_proj.weight"],
         sd[a + "v_proj.weight"]])
    w[p + "attention.query_layernorm.weight"] = sd[a + "q_norm.weight"]
    w[p + "attention.key_layernorm.weight"] = sd[a + "k_norm.weight"]
    w[p + "attention.dense.weight"] = sd[a + "o_proj.weight"]
    for n in ("input_layernorm", "post_attention_layernorm", "mlp.gate_proj",
              "mlp.up_proj", "mlp.down_proj"):
      w[f"{p}{n}.weight"] = sd[f"{p}{n}.weight"]
  return model, w


def test_dense_full_rotary_forward_matches_transformers_qwen3(tiny):
  _, cfg, _ = tiny
  cfg = dict(cfg, partial_rotary_factor=1.0, first_k_dense_replace=2)
  model, w = _qwen3_as_llada2()
  ids = np.random.default_rng(0).integers(0, fx.VOCAB, (2, 12))
  with torch.no_grad():
    want = model(input_ids=torch.from_numpy(ids),
                 attention_mask=torch.zeros(2, 1, 12, 12,
                                            dtype=torch.float64)).logits
  # transformers keeps its norms and rotary tables in float32
  np.testing.assert_allclose(ln.forward(w, cfg, ids), want.numpy(),
                             rtol=1e-5, atol=1e-5)


def test_router_and_experts_match_transformers_deepseek_v3(tiny):
  weights, cfg, _ = tiny
  dc = transformers.DeepseekV3Config(
      hidden_size=32, moe_intermediate_size=16, n_routed_experts=8,
      num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
      norm_topk_prob=True, routed_scaling_factor=2.5)
  from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
  moe = ds.DeepseekV3MoE(dc).eval()  # float32: its router is fp32
  p = "model.layers.1.mlp."
  # positive biases: DeepseekV3 zero-fills the dropped groups where the
  # LLaDA2 router uses -inf, which agrees while the kept scores are > 0
  w = dict(weights, **{p + "gate.expert_bias": np.abs(
      weights[p + "gate.expert_bias"])})
  sd = {("gate.e_score_correction_bias" if k.endswith("expert_bias")
         else k[len(p):]): torch.from_numpy(v.astype(np.float32))
        for k, v in w.items() if k.startswith(p)}
  moe.load_state_dict(sd)
  x = np.random.default_rng(3).standard_normal((2, 7, 32))
  with torch.no_grad():
    want = moe(torch.from_numpy(x.astype(np.float32))).numpy()
  got = ln.moe(x, w, "model.layers.1.", ln.resolve_config(cfg))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  idx, weight = ln.route(x.reshape(-1, 32), w, p, ln.resolve_config(cfg))
  assert (idx // 4 == idx[:, :1] // 4).all()  # both from one kept group
  np.testing.assert_allclose(weight.sum(-1), 2.5)


def test_partial_rope_rotates_the_first_half_pairwise():
  x = np.random.default_rng(0).standard_normal((1, 3, 2, 8))
  cos, sin = ln.rope_cos_sin(np.arange(3)[None], 4, 600000.0)
  y = ln.apply_rope(x, cos, sin)
  np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
  inv = 600000.0 ** (-np.arange(0, 4, 2) / 4)
  for pos in range(3):
    for i in range(2):  # dims (i, i + 2) rotate by pos * inv[i]
      c, s = np.cos(pos * inv[i]), np.sin(pos * inv[i])
      a, b = x[0, pos, :, i], x[0, pos, :, i + 2]
      np.testing.assert_allclose(y[0, pos, :, i], a * c - b * s)
      np.testing.assert_allclose(y[0, pos, :, i + 2], b * c + a * s)


def test_forward_is_block_causal(tiny):
  weights, cfg, _ = tiny
  rng = np.random.default_rng(1)
  ids = rng.integers(0, 290, (1, 12))
  base = ln.forward(weights, cfg, ids, block_length=4)
  later = ids.copy()
  later[0, 4:] = rng.integers(0, 290, 8)
  moved = ln.forward(weights, cfg, later, block_length=4)
  np.testing.assert_allclose(moved[0, :4], base[0, :4], rtol=1e-12)
  assert np.abs(moved[0, 4:] - base[0, 4:]).max() > 1e-3
  inside = ids.copy()
  inside[0, 3] = (ids[0, 3] + 1) % 290  # bidirectional within a block
  assert np.abs(ln.forward(weights, cfg, inside, block_length=4)[0, 0]
                - base[0, 0]).max() > 1e-3
  np.testing.assert_allclose(
      ln.forward(weights, cfg, ids, mask=ln.block_causal_mask(12, 4)), base)


def test_num_transfer_tokens_schedule():
  assert lr.num_transfer_tokens(32, 32).tolist() == [1] * 32
  assert lr.num_transfer_tokens(8, 3).tolist() == [3, 3, 2]
  assert lr.num_transfer_tokens(4, 6).tolist() == [1, 1, 1, 1, 0, 0]
  assert lr.num_transfer_tokens(4, 0).tolist() == []


def test_sampling_rules():
  logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]))
  tok, conf = lr.sample(logits)
  assert tok.tolist() == [1, 0]
  np.testing.assert_allclose(conf, [0.6, 0.5])
  assert np.isinf(lr.filter_top_k(logits, 2)).tolist() == [
      [True, False, False], [False, True, False]]
  assert np.isinf(lr.filter_top_p(logits, 0.65)).tolist() == [
      [True, False, False], [False, True, False]]
  tok, conf = lr.sample(logits, temperature=0.5, top_k=1,
                        rng=np.random.default_rng(0))
  assert tok.tolist() == [1, 0] and conf.tolist() == [1.0, 1.0]


MASK, EOS, V = 50, 51, 60


def _toy(eos_at=None, edit=False):
  """Predicts token (3 * pos) % 40 with confidence rising with the position
  (eos at `eos_at`); with `edit`, a committed position is predicted as
  token + 1 with probability ~0.99, a masked one with ~0.6."""
  calls = []

  def fn(x_1xW):
    calls.append(x_1xW.copy())
    w = x_1xW.shape[1]
    pos = np.arange(w)
    tok = (3 * pos) % 40
    if eos_at is not None:
      tok = np.where(pos == eos_at, EOS, tok)
    strength = 2.0 + 0.1 * pos
    if edit:
      committed = x_1xW[0] != MASK
      tok = np.where(committed, tok + 1, tok)
      strength = np.where(committed, 9.0, 4.5)
    logits = np.zeros((1, w, V))
    logits[0, pos, tok] = strength
    return logits
  return fn, calls


def test_v20_commits_on_the_schedule_and_counts_calls():
  prompt = np.arange(5)
  fn, calls = _toy()
  out = lr.generate_v20(fn, prompt, gen_length=8, block_length=4, steps=3,
                        threshold=1.5, mask_id=MASK, eos_id=EOS)
  assert out.tokens.tolist() == [(3 * p) % 40 for p in range(5, 13)]
  # block [4, 8) has 3 masks: 2 + 1; then 2 + 1 + 1 for two full blocks
  assert out.calls == len(calls) == 8
  assert [c.shape[1] for c in calls] == [8, 8, 12, 12, 12, 16, 16, 16]
  second = calls[3][0, 8:12]  # confidence rises: the right end goes first
  assert (second[2:] != MASK).all() and (second[:2] == MASK).all()
  assert (calls[0][0, :5] == prompt).all()
  fn, calls = _toy()
  out = lr.generate_v20(fn, prompt, gen_length=8, block_length=4, steps=3,
                        threshold=0.0, mask_id=MASK, eos_id=EOS)
  assert out.calls == 3 and len(out.tokens) == 8


def test_v20_stops_after_the_eos_block_or_early():
  fn, _ = _toy(eos_at=9)
  out = lr.generate_v20(fn, np.arange(5), gen_length=8, block_length=4,
                        steps=4, threshold=0.0, mask_id=MASK, eos_id=EOS)
  assert out.tokens.tolist() == [15, 18, 21, 24, EOS] and out.calls == 2
  assert not out.early_stop
  fn, _ = _toy(eos_at=9)
  out = lr.generate_v20(fn, np.arange(5), gen_length=8, block_length=4,
                        steps=4, threshold=0.0, eos_early_stop=True,
                        mask_id=MASK, eos_id=EOS)
  assert out.early_stop and out.tokens.tolist() == [15, 18, 21, 24, EOS]


def test_v21_confirms_each_block_and_edits_committed_tokens():
  fn, calls = _toy()
  out = lr.generate_v21(fn, np.arange(5), gen_length=8, block_length=4,
                        threshold=0.0, mask_id=MASK, eos_id=EOS)
  assert out.tokens.tolist() == [(3 * p) % 40 for p in range(5, 13)]
  assert out.calls == len(calls) == 6  # fill, then one confirming call
  fn, calls = _toy(edit=True)
  out = lr.generate_v21(fn, np.arange(5), gen_length=8, block_length=4,
                        threshold=0.5, editing_threshold=0.9,
                        mask_id=MASK, eos_id=EOS)
  assert out.tokens.tolist() == [(3 * p) % 40 + 1 for p in range(5, 13)]
  assert out.calls == 9  # commit, edit, confirm per block
  assert (calls[-1][0, :5] == np.arange(5)).all()  # prompt never edited
  fn, _ = _toy(edit=True)
  out = lr.generate_v21(fn, np.arange(5), gen_length=8, block_length=4,
                        threshold=0.5, max_post_steps=1, mask_id=MASK,
                        eos_id=EOS)
  assert out.calls == 6


def test_v21_early_stop_ends_after_the_eos_block():
  fn, _ = _toy(eos_at=6)
  kw = dict(gen_length=12, block_length=4, threshold=0.0, mask_id=MASK,
            eos_id=EOS)
  out = lr.generate_v21(fn, np.arange(5), eos_early_stop=True, **kw)
  assert out.tokens.tolist() == [15, EOS] and out.calls == 2
  fn, _ = _toy(eos_at=6)
  out = lr.generate_v21(fn, np.arange(5), **kw)
  assert out.tokens.tolist() == [15, EOS] and out.calls == 8
