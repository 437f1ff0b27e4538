"""Memory: the compiled decode's buffers grow with the batch as its data
does, the server's slot plan from a memory budget, and a prompt of the
model's whole context served by default."""

import functools
import math

import jax
import jax.numpy as jnp
import openai
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import decode_jit
from flash_dllm_jax.model import KVCache, init_params
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.serve import memory_plan
from flash_dllm_jax.strategies import build_sampler
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import Server

V = 4096  # a vocabulary large beside the cache, so a per-position head shows
CONFIG = ModelConfig.tiny("llada", n_layers=4, n_kv_heads=4, vocab_size=V,
                          mask_token_id=V - 1, eos_token_id=V - 4,
                          pad_token_id=V - 4, bos_token_id=V - 5,
                          eot_token_id=V - 3)
PROMPT, N = 192, 256  # prompt and prompt + gen_length positions


@functools.cache
def _decode_temp_bytes(config, sampler, b: int, prompt: int,
                       implementation: str | None = None) -> int:
  """XLA's temporary bytes of the compiled decode of b rows (abstract
  inputs: nothing runs); memoized, so tests share a compile."""
  params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  rng = jax.eval_shape(
      lambda: jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32)))
  spec = jax.ShapeDtypeStruct
  compiled = decode_jit.lower(
      params, spec((b, prompt), jnp.int32), spec((b, prompt), bool), rng,
      None, config=config, sampler=sampler, stop_at_eos=False,
      implementation=implementation).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def _per_row(sampler, implementation=None, config=CONFIG) -> float:
  """The compiled decode's cost of a further row: its temporary bytes at 8
  rows less at 4 (both above max_refills, so the prefill group is the
  same), over 4."""
  small, large = (_decode_temp_bytes(config, sampler, b, PROMPT,
                                     implementation) for b in (4, 8))
  return (large - small) / 4


@pytest.mark.parametrize("strategy",
                         ["flash-cache", "flash-dllm", "flash-dllm-onepass"])
def test_decode_memory_grows_with_the_batch_as_its_data(strategy):
  """Flash-dLLM's compiled decodes (draft only, draft + verify, verify in
  the next step's forward): each further row costs at most two rows of KV
  cache, a few copies of the scored rows' logits and of one layer's
  float32 attention scores (the CPU's reference attention), well under one
  float32 row of logits for every position (N x V x 4), and far under the
  extra full cache a prefill group of every row used to need."""
  sampler = build_sampler(strategy, "llada", dict(gen_length=64, block_m=8))
  per_row = _per_row(sampler)
  cache_row = memory_plan.slot_bytes(CONFIG, N) - N * 64  # its KV alone
  q, r = sampler.query_budget, sampler._scored
  scores = CONFIG.n_heads * q * N * 4
  bound = 2 * cache_row + 4 * r * V * 4 + 2 * scores
  assert bound < N * V * 4  # the bound rules out a full-vocab buffer
  assert 0 < per_row <= bound, (per_row, bound)


def test_elastic_cache_decode_memory_per_row():
  """Elastic-Cache's compiled decode through the attention kernel (the
  Pallas interpreter: the GPU program's buffers, no N x N scores): each
  further row costs its KV cache row, its stored layer inputs (every
  layer's input at every position, which a drift restart recomputes
  from) and one layer's float32 activations over every position (a full
  pass; memory_plan's estimate of them). The stored inputs and keys are
  written in place: a copy of them kept across the step exceeds this."""
  sampler = build_sampler("elastic-cache", "llada", dict(gen_length=64))
  per_row = _per_row(sampler, "pallas_interpret")
  cache_row = memory_plan.slot_bytes(CONFIG, N) - N * 64
  stored = CONFIG.n_layers * N * CONFIG.d_model * 4  # float32 model
  widest = max(CONFIG.mlp_hidden, CONFIG.n_heads * CONFIG.head_dim,
               CONFIG.d_model)
  layer = N * 4 * (3 * widest + 4 * CONFIG.d_model)
  bound = cache_row + stored + layer
  assert bound < N * V * 4
  assert cache_row + stored < per_row <= bound, (per_row, bound)


def test_8bit_cache_decode_memory_per_row():
  """With a float8 cache the compiled decode's cost of a further row is
  below the bf16-cache decode's (the cache row is a third here: float32
  model, bf16 scales), within the bound of the test above with the 8-bit
  cache row plus one layer's K and V dequantized to float32 (the CPU's
  reference attention; the GPU kernel dequantizes per tile)."""
  config, n = CONFIG, N
  per_row = {}
  for dtype in ("auto", "float8_e4m3fn"):
    sampler = build_sampler("flash-cache", "llada", dict(
        gen_length=64, block_m=8, kv_cache_dtype=dtype))
    per_row[dtype] = _per_row(sampler)
  row = {d: memory_plan.slot_bytes(config, n, d) - n * 64 for d in per_row}
  assert 3 * row["float8_e4m3fn"] < row["auto"]
  q, r = sampler.query_budget, sampler._scored
  layer_f32 = 2 * n * config.n_kv_heads * config.head_dim * 4
  bound = (2 * row["float8_e4m3fn"] + layer_f32 + 4 * r * V * 4
           + 2 * config.n_heads * q * n * 4)
  assert 0 < per_row["float8_e4m3fn"] <= bound, (per_row, bound)
  assert per_row["float8_e4m3fn"] < per_row["auto"] - (
      row["auto"] - row["float8_e4m3fn"]) / 2, per_row


def test_8bit_cache_slot_bytes_and_plan():
  """An 8-bit slot holds its 8-bit K/V and bf16 scales: LLaDA-8B's
  batch 128 at prompt 768 + gen 512 holds 43.6 GB of cache (85.9 GB in
  bf16), and the plan fits about twice the slots in the same budget."""
  config = ModelConfig.preset("llada-8b")
  for fmt in ("float8_e4m3fn", "int8"):
    cache = jax.eval_shape(lambda: KVCache.zeros(config, 1, 1280, fmt))
    kv = sum(math.prod(a.shape) * a.dtype.itemsize
             for a in jax.tree.leaves(cache))
    assert memory_plan.slot_bytes(config, 1280, fmt) == kv + 1280 * 64
    assert kv == 2 * 32 * 1280 * 32 * (128 + 2)
  assert round(128 * kv / 1e9, 1) == 43.6
  weights = 16 * 10**9
  plans = {}
  for fmt in ("auto", "float8_e4m3fn"):
    sampler = build_sampler("flash-dllm", "llada",
                            {"gen_length": 512, "kv_cache_dtype": fmt})
    plans[fmt] = memory_plan.plan_slots(
        config, sampler, weight_bytes=weights, budget_bytes=72 * 10**9,
        max_prompt_tokens=768)
  assert plans["float8_e4m3fn"].slot_bytes < plans["auto"].slot_bytes * 0.51
  assert plans["float8_e4m3fn"].slots >= 1.9 * plans["auto"].slots


def test_slot_bytes_is_the_kv_cache_and_the_row_state():
  config = ModelConfig.preset("llada-8b")
  cache = jax.eval_shape(lambda: KVCache.zeros(config, 1, 1280))
  kv = sum(math.prod(a.shape) * a.dtype.itemsize
           for a in jax.tree.leaves(cache))
  assert memory_plan.slot_bytes(config, 1280) == kv + 1280 * 64
  assert kv == 2 * 32 * 1280 * 4096 * 2  # 671 MB a row at LLaDA-8B shapes


def test_elastic_cache_slot_holds_its_stored_inputs():
  """An Elastic-Cache slot holds, beside its KV cache and loop state, every
  layer's stored input at every position (its ElasticAux.hidden): half
  again the KV cache at LLaDA-8B's shapes, so the plan fits fewer slots."""
  config = ModelConfig.preset("llada-8b")
  sampler = build_sampler("elastic-cache", "llada", {"gen_length": 512})
  model = SequenceModel.for_batch(config, None, jnp.ones((1, 1280), bool))
  aux = jax.eval_shape(lambda: sampler.init_aux(
      model, jnp.zeros((1, 1280), jnp.int32)))
  nbytes = lambda tree: sum(math.prod(a.shape) * a.dtype.itemsize
                            for a in jax.tree.leaves(tree))
  kv, stored = nbytes(aux.cache), nbytes(aux.hidden)
  assert 2 * stored == kv == memory_plan.slot_bytes(config, 1280) - 1280 * 64
  assert (memory_plan.sampler_slot_bytes(config, sampler, 1280)
          == kv + stored + 1280 * 64)
  plan = lambda name: memory_plan.plan_slots(
      config, build_sampler(name, "llada", {"gen_length": 512}),
      weight_bytes=16 * 10**9, budget_bytes=72 * 10**9,
      max_prompt_tokens=768)
  elastic, flash = plan("elastic-cache"), plan("flash-dllm")
  assert elastic.slot_bytes == kv + stored + 1280 * 64
  assert elastic.slots < flash.slots * 0.7


def test_slot_plan_from_a_memory_budget():
  """As many slots as fit the budget after the weights and the workspace,
  each holding the longest prompt the context leaves; per data device
  under a mesh; the slot count asked for; a clear error when none fits."""
  config = ModelConfig.preset("llada-8b")
  sampler = build_sampler("flash-dllm", "llada", {"gen_length": 512})
  weights = 16 * 10**9
  positions = 4096  # 3584 prompt positions + 512
  slot = memory_plan.slot_bytes(config, positions)
  work = memory_plan.workspace_bytes(config, sampler, positions)
  budget = weights + work + 10 * slot + slot // 2
  plan = memory_plan.plan_slots(config, sampler, weight_bytes=weights,
                                budget_bytes=budget)
  assert (plan.slots, plan.max_prompt_tokens) == (10, 3584)
  assert plan.budget_bytes == budget and plan.slot_bytes == slot
  assert "10 slots" in plan.reason and "3584" in plan.reason
  # the budget is one device's: each of 4 data devices holds 10 slots
  assert memory_plan.plan_slots(
      config, sampler, weight_bytes=weights, budget_bytes=budget,
      data_devices=4).slots == 40
  short = memory_plan.plan_slots(config, sampler, weight_bytes=weights,
                                 budget_bytes=budget, max_prompt_tokens=768)
  assert short.max_prompt_tokens == 768 and short.slots > 4 * plan.slots
  assert memory_plan.plan_slots(config, sampler, weight_bytes=weights,
                                budget_bytes=budget, slots=3).slots == 3
  unknown = memory_plan.plan_slots(config, sampler, weight_bytes=weights,
                                   budget_bytes=None)
  assert unknown.slots == 8 and "no memory limit" in unknown.reason
  with pytest.raises(ValueError, match="not one slot of 4096 positions"):
    memory_plan.plan_slots(config, sampler, weight_bytes=weights,
                           budget_bytes=weights + work)
  with pytest.raises(ValueError, match="gpu-memory-utilization"):
    memory_plan.check_utilization(1.5)


def test_server_serves_a_prompt_of_the_whole_context_by_default(tmp_path):
  """No --max-prompt-tokens: the slots hold the model's context less the
  generation (512 - 64 here), /health says how many and why, and a prompt
  of that length is answered."""
  server = Server(TINY_CHECKPOINT, "llada", {"gen_length": 64, "steps": 4},
                  "--batch-size", "1", log_path=tmp_path / "server.log")
  try:
    health = server.wait_ready()
    plan = health["slot_plan"]
    assert health["max_prompt_tokens"] == plan["max_prompt_tokens"] == 448
    assert health["slots"] == 1 and "--batch-size" in plan["reason"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    ids = [7 + i % 300 for i in range(448)]
    out = client.completions.create(model=health["model"], prompt=ids,
                                    max_tokens=64)
    assert out.usage.prompt_tokens == 448
    with pytest.raises(openai.BadRequestError, match="at most 448"):
      client.completions.create(model=health["model"], prompt=ids + [7],
                                max_tokens=64)
  finally:
    server.close()
