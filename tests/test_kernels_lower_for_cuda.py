"""Every Pallas kernel lowers for CUDA through Triton, on the CPU.

JAX lowers for a platform it does not run on (`lower(lowering_platforms=
("cuda",))`), which turns each kernel into Triton IR here: shapes Triton
cannot tile and a kernel that silently took another backend (jax 0.10 sends
a `pallas_call` without Triton compiler params to Mosaic GPU, which refused
the split merge's 64-row tiles at LLaDA-8B shapes) fail in CI instead of on
the GPU machine. Compiling that IR to PTX still happens only on a GPU.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.attention import kernel as attention
from pallas_kernels.attention.tiling import split_count, split_tiles_for
from pallas_kernels.cache_update import kernel as cache_update
from pallas_kernels.grouped_matmul import kernel as grouped_matmul
from pallas_kernels.matmul import kernel as matmul
from pallas_kernels.qmatmul import kernel as qmatmul
from pallas_kernels.rms_norm import kernel as rms_norm
from pallas_kernels.token_logprob import kernel as token_logprob

S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
FP8, I8 = jnp.float8_e4m3fn, jnp.int8


def _lowered(fn, *args):
  """fn's program lowered for CUDA (lowering costs more than reading it:
  a test that reads it twice lowers once)."""
  return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def _cuda_text(fn, *args):
  return _lowered(fn, *args).as_text()


def _calls(lowered):
  return re.findall(r"custom_call @([\w$.]+)", lowered.as_text())


def _custom_calls(fn, *args):
  return _calls(_lowered(fn, *args))


def _assert_triton_only(calls, at_least):
  assert len(calls) >= at_least, calls
  assert set(calls) == {"__gpu$xla.gpu.triton"}, calls


@pytest.mark.parametrize("b,q,h,kh,s,split_tiles,splits,group", [
    (32, 144, 32, 32, 1280, 10, 2, 1),  # LLaDA-8B's Flash-Cache step, batch 32
    (1, 144, 28, 4, 1280, 7, 3, 1),     # Dream-7B's heads, three key splits
    (1, 16, 28, 4, 1280, None, 5, 1),   # Dream-7B's default: 4 tiles a split
    (2, 16, 6, 6, 256, None, 1, 1),     # the shipped model's shape, one split
    (32, 128, 32, 32, 1280, 4, 5, 2)])  # split groups: 3 programs a row tile
def test_scheduled_attention_with_mass_and_split_merge(b, q, h, kh, s,
                                                       split_tiles, splits,
                                                       group):
  d, t = 128, 16
  args = (S((b, q, h, d), BF16), S((b, s, kh, d), BF16),
          S((b, s, kh, d), BF16), S((b,), I32), S((b,), I32),
          S((b, t, kh, d), BF16), S((b, t, kh, d), BF16), S((b, q, t), bool),
          S((b, s), bool), S((b, q), bool))

  def run(qq, kc, vc, kl, ql, kn, vn, inq, excl, score):
    return attention.scheduled_attention(
        qq, kc, vc, kl, ql, scale=d ** -0.5, k_new_BxIxKxD=kn,
        v_new_BxIxKxD=vn, inq_mask_BxQxI=inq, exclude_BxS=excl,
        score_rows_BxQ=score, split_tiles=split_tiles, split_group=group)

  st = split_tiles or split_tiles_for(args[0].shape, args[1].shape)
  assert split_count(s, 64, st) == splits
  text = _cuda_text(run, *args)
  # attention (+ mass), then the merge and a mass-only pass with splits
  _assert_triton_only(re.findall(r"custom_call @([\w$.]+)", text),
                      3 if splits > 1 else 1)
  # the key split axis of the grid: a program a split group
  assert f"grid_y = {-(-splits // group)} : i32, grid_z = {b * kh}" in text


@pytest.mark.parametrize("fmt", [FP8, I8])
def test_scheduled_attention_8bit_cache(fmt):
  """LLaDA-8B's Flash-Cache step at batch 128 over an 8-bit cache: the
  per-tile dequantization lowers to Triton (fused mass and split merge)."""
  b, q, h, kh, d, s = 128, 144, 32, 32, 128, 1280
  args = (S((b, q, h, d), BF16), S((b, s, kh, d), fmt),
          S((b, s, kh, d), fmt), S((b,), I32), S((b,), I32),
          S((b, s, kh), BF16), S((b, s, kh), BF16), S((b, s), bool),
          S((b, q), bool))

  def run(qq, kc, vc, kl, ql, ks, vs, excl, score):
    return attention.scheduled_attention(
        qq, kc, vc, kl, ql, scale=d ** -0.5, exclude_BxS=excl,
        score_rows_BxQ=score, k_scale_BxSxK=ks, v_scale_BxSxK=vs,
        score_prefix=32)

  _assert_triton_only(_custom_calls(run, *args), 1)


def test_rope_cache_write():
  b, q, h, kh, d, s = 4, 144, 32, 8, 128, 1280
  args = (S((b, q, h, d), BF16), S((b, q, kh, d), BF16), S((b, q, kh, d), BF16),
          S((b, q), I32), S((b, q), I32), S((b, s, kh, d), BF16),
          S((b, s, kh, d), BF16))
  calls = _custom_calls(
      lambda *a: cache_update.rope_write(*a, theta=500000.0, scale=0.088), *args)
  _assert_triton_only(calls, 1)


def test_stream_matmul():
  calls = _custom_calls(lambda x, w: matmul.matmul(x, w),
                        S((16, 4096), BF16), S((4096, 12288), BF16))
  _assert_triton_only(calls, 1)


def _triton_dots(lowered):
  """The operand types of every tt.dot in the Triton modules of a program
  lowered for CUDA (each module's IR is MLIR bytecode inside the custom
  call's config)."""
  from jax._src.lib.mlir import ir
  from jaxlib.triton import dialect
  module = lowered.compiler_ir()
  dots = []

  def walk(op):
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          if inner.name == "stablehlo.custom_call":
            config = ir.DictAttr(inner.attributes["mhlo.backend_config"])
            ctx = ir.Context()
            dialect.register_dialect(ctx)
            text = str(ir.Module.parse(
                ir.StringAttr(config["ir"]).value_bytes, context=ctx))
            dots.extend(re.findall(
                r"tt\.dot .*: (tensor<\S+>) \* (tensor<\S+>)", text))
          walk(inner)

  walk(module.operation)
  return dots


@pytest.mark.parametrize("w_dtype", [I8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("activations", ["bf16", "fp8"])
@pytest.mark.parametrize("m,e,o,z,swiglu,split", [
    (16, 4096, 12288, 1, True, None),   # LLaDA-8B gate+up, batch 1
    (144, 12288, 4096, 96, False, 1),   # down, groups of 128, fused epilogue
    (300, 4096, 4096, 1, False, None)])  # q/k/v/o, split-E
def test_stream_qmatmul(w_dtype, activations, m, e, o, z, swiglu, split):
  """Both weight dtypes under both activations; W8A8 with e4m3 weights is an
  fp8 x fp8 dot, every other pair a bf16 one."""
  def run(x, w, s, wu, su, r):
    return qmatmul.matmul(
        x, w, s, w_up_OxE=wu if swiglu else None,
        scale_up_OxZ=su if swiglu else None,
        residual_MxO=None if swiglu else r, activations=activations,
        split_e=split)
  args = (S((m, e), BF16), S((o, e), w_dtype), S((o, z), F32),
          S((o, e), w_dtype), S((o, z), F32), S((m, o), BF16))
  lowered = _lowered(run, *args)
  _assert_triton_only(_calls(lowered), 1)
  fp8 = activations == "fp8" and w_dtype == FP8
  operand = "f8E4M3FN" if fp8 else "bf16"
  dots = _triton_dots(lowered)
  assert len(dots) == 1 + swiglu, dots
  for a, b in dots:
    assert a == f"tensor<16x128x{operand}>", dots
    assert b == f"tensor<128x64x{operand}>", dots


@pytest.mark.parametrize("fmt", ["bf16", "int8", "fp8", "int8_g128"])
def test_grouped_matmul_at_llada2_mini_expert_shapes(fmt):
  """Gate/up fused and down over 412 row tiles of 64 (batch 1's bound),
  bf16 or 8-bit stacks: one Triton call each, bf16 dots of the tiles."""
  x, i, m, p = 256, 2048, 512, 412 * 64

  def stack(n_in, n_out):
    if fmt == "bf16":
      return (S((x, n_in, n_out), BF16),)
    z = n_in // 128 if fmt == "int8_g128" else 1
    return (S((x, n_out, n_in), FP8 if fmt == "fp8" else I8),
            S((x, n_out, z), F32))

  def run(rows, te, gate, up, down):
    h = grouped_matmul.grouped_matmul(rows, te, gate, up=up)
    return grouped_matmul.grouped_matmul(h, te, down)

  args = (S((p, i), BF16), S((p // 64,), I32), stack(i, m), stack(i, m),
          stack(m, i))
  lowered = _lowered(run, *args)
  _assert_triton_only(_calls(lowered), 2)
  k = 128 if fmt == "int8_g128" else 64
  assert sorted(_triton_dots(lowered)) == sorted(
      [(f"tensor<64x{k}xbf16>", f"tensor<{k}x128xbf16>")] * 3), fmt


def test_routed_experts_op_lowers_to_the_grouped_kernel():
  """ops.routed_experts with 'pallas' at the mini's shapes (1280 tokens):
  the sort and gathers in XLA, the two products in Triton."""
  from flash_dllm_jax import ops
  t, k, x, e, m = 1280, 8, 256, 2048, 512
  stacks = ((S((x, e, m), BF16),), (S((x, e, m), BF16),),
            (S((x, m, e), BF16),))
  calls = _custom_calls(
      lambda a, ids, st: ops.routed_experts(a, ids, 0, st,
                                            implementation="pallas"),
      S((t, e), BF16), S((t, k), I32), stacks)
  _assert_triton_only(calls, 2)


@pytest.mark.parametrize("n,e", [(4608, 4096), (144, 3584), (17, 384)])
def test_rms_norm(n, e):
  calls = _custom_calls(lambda x, s: rms_norm.rms_norm(x, s, eps=1e-5),
                        S((n, e), BF16), S((e,), BF16))
  _assert_triton_only(calls, 1)


@pytest.mark.parametrize("n,v", [(4608, 126464), (17, 1024)])
def test_token_logprob(n, v):
  calls = _custom_calls(token_logprob.token_logprob, S((n, v), F32),
                        S((n,), I32))
  _assert_triton_only(calls, 1)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_flash_dllm_decode_loop_lowers_for_cuda_at_full_size(arch):
  """The compiled decode loop of Flash-dLLM at LLaDA-8B / Dream-7B shapes
  (batch 32, prompt 768, gen 512), abstract weights: every kernel the GPU
  would run is a Triton call, at the real tile counts and key splits."""
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.generate import decode_tokens
  from flash_dllm_jax.model.transformer import init_params
  from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
  cfg = ModelConfig.preset("llada-8b") if arch == "llada" else ModelConfig.preset("dream-7b")
  b = 32
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  rng = jax.eval_shape(
      lambda: jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32)))
  sampler = FlashDLLMSampler(gen_length=512, block_m=16, rule="fixed",
                             steps=128, verify=True)
  calls = _custom_calls(
      lambda p, x, m, r: decode_tokens(
          p, x, m, r, config=cfg, sampler=sampler, stop_at_eos=False,
          implementation="pallas"),
      params, S((b, 768), I32), S((b, 768), bool), rng)
  _assert_triton_only(calls, 4)


def test_8bit_cache_decode_loop_lowers_for_cuda_at_batch_128():
  """Flash-dLLM's compiled loop at LLaDA-8B shapes, batch 128, a float8
  KV cache: every kernel is a Triton call, the cache is float8 and no
  bfloat16 (or float32) tensor of a layer's whole cache exists."""
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.generate import decode_tokens
  from flash_dllm_jax.model.transformer import init_params
  from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
  cfg = ModelConfig.preset("llada-8b")
  b = 128
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  rng = jax.eval_shape(
      lambda: jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32)))
  sampler = FlashDLLMSampler(gen_length=512, block_m=16, rule="fixed",
                             steps=128, verify=True,
                             kv_cache_dtype="float8_e4m3fn")
  fn = lambda p, x, m, r: decode_tokens(
      p, x, m, r, config=cfg, sampler=sampler, stop_at_eos=False,
      implementation="pallas")
  args = (params, S((b, 768), I32), S((b, 768), bool), rng)
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  _assert_triton_only(re.findall(r"custom_call @([\w$.]+)", text), 4)
  whole = "tensor<128x1280x32x128x"
  assert f"{whole}f8E4M3FN>" in text
  assert f"{whole}bf16>" not in text and f"{whole}f32>" not in text


def test_llada2_decode_loop_lowers_for_cuda_at_mini_size():
  """Strategy llada2's compiled loop at LLaDA2.0-mini shapes (batch 32,
  prompt 768, gen 512), abstract weights: the routed experts of every MoE
  layer are Triton calls (gate/up and down), as is everything else."""
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.generate import decode_tokens
  from flash_dllm_jax.model.transformer import init_params
  from flash_dllm_jax.strategies import build_sampler
  cfg = ModelConfig.preset("llada2-mini")
  b = 32
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  rng = jax.eval_shape(
      lambda: jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32)))
  sampler = build_sampler("llada2", "llada2", dict(
      gen_length=512, block_length=32, threshold=None, steps=2))
  fn = lambda p, x, m, r: decode_tokens(
      p, x, m, r, config=cfg, sampler=sampler, stop_at_eos=False,
      implementation="pallas")
  args = (params, S((b, 768), I32), S((b, 768), bool), rng)
  lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
  text = lowered.as_text()
  _assert_triton_only(re.findall(r"custom_call @([\w$.]+)", text), 2)
  # Each of the block cache's three forwards (the window, the finished
  # block with the current one, the current block alone) has one layers'
  # loop body holding one MoE layer: gate/up and down.
  names = re.findall(r'custom_call @\S+\(.*name = "(\w+)"', text)
  assert names.count("grouped_matmul") == 3 * 2, names


@pytest.mark.parametrize("b", [1, 8])
@pytest.mark.parametrize("q", [32, 4128])  # a block step; the whole window
def test_block_attention_split_at_llada2_mini_shapes(b, q):
  """Kernels(block_attention="split"): block-causal attention at LLaDA2.0-
  mini's shapes (16 heads over 4 KV heads of 128, block 32, 4128 keys) is
  the split kernel with kv_repeat (and its merge), Triton only, the cache
  read in place (no copy of it per decode block)."""
  from flash_dllm_jax import ops
  s, h, kh, d, bl = 4128, 16, 4, 128, 32
  kernels = ops.Kernels("pallas", block_attention="split")

  def run(qq, kc, vc, valid, key_blocks, blocks, rows):
    mask = ops.BlockCausal(valid, key_blocks, blocks, rows, bl)
    return ops.attention(qq, kc, vc, mask, scale=d ** -0.5,
                         implementation=kernels)

  args = (S((b, q, h, d), BF16), S((b, s, kh, d), BF16),
          S((b, s, kh, d), BF16), S((b, s), bool), S((b, s), I32),
          S((b, q), I32), S((b, q), I32))
  text = jax.jit(run).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  _assert_triton_only(re.findall(r"custom_call @([\w$.]+)", text), 1)
  c = (q + bl - 2) // bl + 1  # decode blocks a row's queries may span
  assert f"grid_z = {b * c * kh} : i32" in text  # a program a block, KV head
  assert f"tensor<{b * c}x{s}x{kh}x{d}xbf16>" not in text
