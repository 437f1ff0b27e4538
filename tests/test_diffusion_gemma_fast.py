"""DiffusionGemma's fast forward (architectures/diffusion_gemma/fast.py)
against the plain reference forward and Google's logits, on the tiny
official checkpoint (window 4 < canvas 6: the local layers read a window,
the global ones the prefix): the CPU's path (every expert on every row)
and the grouped expert GEMM the GPU runs (here in Pallas's interpreter);
bitwise row invariance; 8-bit experts through the grouped GEMM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import checkpoint
from flash_dllm_jax.architectures.diffusion_gemma import fast as F
from flash_dllm_jax.architectures.diffusion_gemma import model as M
from flash_dllm_jax.compilation import compiler_options
from tests.paths import ROOT

REF = ROOT / "tests" / "reference" / "diffusion_gemma"
OFFICIAL_TOL = 1e-3  # as the reference forward (test_diffusion_gemma_model)
TOL = 1e-4  # fast vs reference, float32: other key windows, other sums
# One compiled program per shape, shared by the tests, with the decode
# loop's batch-invariant XLA options (compilation.py).
FAST = jax.jit(F.forward, static_argnums=(1,),
               static_argnames=("logits", "implementation"),
               compiler_options=compiler_options())
REFERENCE = jax.jit(M.forward, static_argnums=(1,),
                    static_argnames=("logits",),
                    compiler_options=compiler_options())
GROUPED = "pallas_interpret"  # the GPU's grouped expert GEMM, interpreted


@pytest.fixture(scope="module")
def tiny():
  params, config, _ = checkpoint.load(REF / "tiny", dtype="float32")
  return params, config, dict(np.load(REF / "forward.npz"))


def test_fast_forward_matches_the_reference_and_the_official_model(tiny):
  """Prefill, two self-conditioned denoising steps, the append, a second
  canvas (the CPU's path): logits within 1e-3 of Google's, within 1e-4 of
  the reference forward, and the same cache as the reference writes."""
  params, config, ref = tiny
  assert config.sliding_window < ref["step0_tokens"].shape[1]
  length = ref["step0_mask"].shape[-1]
  cache_f = cache_r = M.empty_cache(config, 2, length)
  for tag, sc in (("prefill", None), ("step0", "step0_sc"),
                  ("step1", "step1_sc"), ("append", None),
                  ("step2", "step2_sc")):
    slots = jnp.asarray(ref[f"{tag}_positions"])
    last = M.causal(slots) if sc is None else M.canvas(slots)
    args = (jnp.asarray(ref[f"{tag}_tokens"]), slots)
    s = None if sc is None else jnp.asarray(ref[sc])
    got, new_f = FAST(params, config, *args, cache_f, last, s)
    want, new_r = REFERENCE(params, config, *args, cache_r, last, s)
    np.testing.assert_allclose(got, ref[f"{tag}_logits"], atol=OFFICIAL_TOL,
                               rtol=0)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    if sc is None:  # a causal pass keeps its K/V; a canvas step's is scratch
      jax.tree.map(lambda a, b: np.testing.assert_allclose(
          a, b, atol=TOL, rtol=0), new_f, new_r)
      cache_f, cache_r = new_f, new_r


def test_a_long_pass_attends_a_chunk_of_queries_at_a_time(tiny,
                                                          monkeypatch):
  """A causal prefill of more than QUERY_CHUNK queries (chunks of 4 here,
  rows of 11 and 7 left-padded tokens): the reference's logits and
  cache."""
  params, config, _ = tiny
  monkeypatch.setattr(F, "QUERY_CHUNK", 4)
  tokens = jax.random.randint(jax.random.key(0), (2, 11), 0, 160)
  slots = jnp.arange(11)[None] - jnp.asarray([0, 4])[:, None]
  slots = jnp.where(slots >= 0, slots, -1)
  cache = M.empty_cache(config, 2, 20)
  got, got_cache = jax.jit(F.forward, static_argnums=(1,))(
      params, config, tokens, slots, cache, M.causal(slots))
  want, want_cache = REFERENCE(params, config, tokens, slots, cache,
                               M.causal(slots))
  valid = np.asarray(slots) >= 0
  np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid],
                             atol=TOL, rtol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=TOL,
                                                       rtol=0),
               got_cache, want_cache)


def _canvas_batch(config, rows=3, length=32, c=6):
  """A canvas step of `rows` rows at different starts over a random cache:
  (tokens, slots, cache, sc)."""
  k = jax.random.split(jax.random.key(3), 2 * config.n_layers + 2)
  cache = tuple(
      {n: jax.random.normal(k[2 * i + j], c0["k"].shape, jnp.float32)
       for j, n in enumerate(("k", "v"))}
      for i, c0 in enumerate(M.empty_cache(config, rows, length)))
  starts = jnp.asarray([3, 9, 20][:rows])
  slots = starts[:, None] + jnp.arange(c)
  tokens = jax.random.randint(k[-2], (rows, c), 0, config.vocab_size)
  sc = jax.random.normal(k[-1], (rows, c, config.d_model))
  return tokens, slots, cache, sc


def test_a_row_has_its_alone_bits_in_any_batch(tiny):
  """A canvas row's logits and written K/V are bit for bit those of the
  row alone, with the cache a batch of one would have (shorter): the
  CPU's path, and the grouped expert GEMM, which also stays within 1e-4
  of the reference forward."""
  params, config, _ = tiny
  tokens, slots, cache, sc = _canvas_batch(config)
  want, _ = REFERENCE(params, config, tokens, slots, cache, M.canvas(slots),
                      sc)
  one = lambda a: a[:1]
  alone_cache = jax.tree.map(lambda a: a[:1, :12], cache)
  for impl in (None, GROUPED):
    batch, batch_cache = FAST(params, config, tokens, slots, cache,
                              M.canvas(slots), sc, implementation=impl)
    np.testing.assert_allclose(batch, want, atol=TOL, rtol=0)
    alone, new = FAST(params, config, one(tokens), one(slots), alone_cache,
                      M.canvas(one(slots)), one(sc), implementation=impl)
    np.testing.assert_array_equal(batch[:1], alone)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[:1, :12], b),
                 batch_cache, new)


def test_8bit_experts_through_the_grouped_gemm(tiny):
  """load(quantize="int8"): the grouped GEMM on the stored 8-bit experts
  equals the dense reference forward on the same 8-bit tree."""
  params, config, ref = tiny
  qparams, qconfig, _ = checkpoint.load(REF / "tiny", dtype="float32",
                                        quantize="int8")
  tokens, slots, cache, sc = _canvas_batch(qconfig)
  got, _ = FAST(qparams, qconfig, tokens, slots, cache, M.canvas(slots), sc,
                implementation=GROUPED)
  want, _ = REFERENCE(qparams, qconfig, tokens, slots, cache,
                      M.canvas(slots), sc)
  np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("fmt", [None, "fp8"])
def test_routed_experts_lower_to_the_grouped_kernel_at_26b_shapes(fmt):
  """fast.routed_experts with 'pallas' at DiffusionGemma_26B_A4B's expert
  shapes (128 experts of 704, width 2816; one canvas of 256 tokens, top
  8), the official bf16 stacks or fp8 ones: the sort and gathers in XLA,
  gate+up and down as two Triton calls (lowered for CUDA on the CPU)."""
  import re
  from flash_dllm_jax.architectures.diffusion_gemma.config import preset
  config = preset("DiffusionGemma_26B_A4B")
  x, m, d = config.moe_experts, config.moe_hidden, config.d_model
  s = jax.ShapeDtypeStruct
  if fmt is None:
    stacks = {"gating_einsum": {"w": s((x, 2, m, d), jnp.bfloat16)},
              "linear": {"w": s((x, m, d), jnp.bfloat16)}}
  else:
    q = lambda o, i: {"w": {"kernel_q": s((x, o, i), jnp.float8_e4m3fn),
                            "scale": s((x, o, 1), jnp.float32)}}
    stacks = {"gating_einsum": q(2 * m, d), "linear": q(d, m)}
  stacks["per_expert_scale"] = s((x,), jnp.bfloat16)
  run = lambda mm, a, ids: F.routed_experts(mm, config, a, ids,
                                            implementation="pallas")
  text = jax.jit(run).trace(stacks, s((256, d), jnp.bfloat16),
                            s((256, config.moe_top_k), jnp.int32)).lower(
      lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"custom_call @([\w$.]+)", text)
  assert calls == ["__gpu$xla.gpu.triton"] * 2, calls


def test_bench_diffusion_gemma_smoke(tmp_path):
  """scripts/bench_diffusion_gemma.py end to end on the tiny geometry: the
  fast pass and the row-by-row baseline, each with its floor, their ratio,
  tokens/s."""
  import importlib.util
  import json
  spec = importlib.util.spec_from_file_location(
      "bench_diffusion_gemma", ROOT / "scripts" / "bench_diffusion_gemma.py")
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  out = tmp_path / "dg.json"
  bench.main(["--smoke", "--json", str(out)])
  rows = json.loads(out.read_text())["rows"]
  assert [(r["forward"], r["batch"]) for r in rows] == [("fast", 2),
                                                        ("rows", 2)]
  for r in rows:
    assert r["ms_per_pass"] > 0 and 0 < r["floor_ms"] and r["tokens_per_s"] > 0
  assert rows[0]["speedup_vs_rows"] > 0


@pytest.mark.gpu
def test_bf16_rows_keep_their_bits_on_the_gpu():
  """On a GPU, bf16, a mid-sized random model (width 512, 16 experts of
  256, top 4; window 32 < canvas 64 < prompt 96): the batched fast
  forward (the grouped kernel, cuBLAS GEMMs without autotuning) gives a
  canvas row alone the bits it has among 1, 3 and 8 rows, and stays
  near the reference forward."""
  from flash_dllm_jax.architectures.diffusion_gemma.checkpoint import (
      init_params)
  from flash_dllm_jax.architectures.diffusion_gemma.config import (
      GemmaConfig)
  tc = dict(num_embed=1024, embed_dim=512, hidden_dim=512, num_heads=8,
            head_dim=64, num_kv_heads=4, final_logit_softcap=30.0,
            use_post_attn_norm=True, use_post_ffw_norm=True,
            attention_types=["LOCAL_SLIDING"] * 2 + ["GLOBAL"],
            sliding_window_size=32, num_global_kv_heads=2,
            global_key_size=128, k_eq_v_global=True,
            global_rope_proportion=0.25, enable_moe=True, num_experts=16,
            expert_dim=256, top_k_experts=4, moe_dense_hidden_dim=512)
  config = GemmaConfig.from_official(tc, dtype="bfloat16")
  params = init_params(config, jax.random.key(0))
  c, rows = 64, 8
  k = jax.random.split(jax.random.key(1), 2 * config.n_layers + 2)
  cache = tuple(
      {n: jax.random.normal(k[2 * i + j], c0["k"].shape, jnp.bfloat16)
       for j, n in enumerate(("k", "v"))}
      for i, c0 in enumerate(M.empty_cache(config, rows, 96 + c)))
  slots = (96 - 4 * jnp.arange(rows))[:, None] + jnp.arange(c)
  tokens = jax.random.randint(k[-2], (rows, c), 0, config.vocab_size)
  sc = jax.random.normal(k[-1], (rows, c, config.d_model), jnp.bfloat16)
  run = lambda n: FAST(params, config, tokens[:n], slots[:n],
                       jax.tree.map(lambda a: a[:n], cache),
                       M.canvas(slots[:n]), sc[:n])[0]
  alone = run(1)
  for n in (3, rows):
    np.testing.assert_array_equal(run(n)[:1], alone)
  want, _ = REFERENCE(params, config, tokens[:1], slots[:1],
                      jax.tree.map(lambda a: a[:1], cache),
                      M.canvas(slots[:1]), sc[:1])
  np.testing.assert_allclose(alone, want, atol=1.0, rtol=0)  # bf16, cap 30
