"""Scheduled attention over an 8-bit KV cache (float8 e4m3 or int8 with a
scale per slot and KV head, pallas_kernels/attention/kv_quant.py): the
kernel, which dequantizes per tile, against the reference, which
dequantizes the cache first; and the quantization's own error bound."""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, kv_quant
from tests.attention_case import CASES, MASS_TOL, inputs, reference_attention
from tests.kernel_case import IMPLS, assert_close, f32, rng as _rng

FORMATS = ["float8_e4m3fn", "int8"]


def _quantized(args, fmt):
  """args with the K and V caches in `fmt` and the scale kwargs."""
  kq, ks = kv_quant.quantize(args[1], fmt)
  vq, vs = kv_quant.quantize(args[2], fmt)
  return ((args[0], kq, vq, *args[3:]),
          dict(k_scale_BxSxK=ks, v_scale_BxSxK=vs))


# float8 on every path (in-query keys + fused mass, a split merge with an
# empty row + mass-only pass, a long cache with logit scores); int8 on one.
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt,name,score", [
    ("float8_e4m3fn", "g4_d128_new", "mass"),
    ("float8_e4m3fn", "g4_d64_split", "mass"),
    ("float8_e4m3fn", "g1_d128_long", "logit"),
    ("int8", "g4_d64_split", "mass")])
def test_kernel_matches_reference(request, impl, fmt, name, score):
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, split_tiles = CASES[name]
  args, kw = inputs(_rng(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                    jnp.bfloat16)
  kw["score"] = score
  qargs, scales = _quantized(args, fmt)
  got_o, got_m = api.scheduled_attention(
      *qargs, **kw, **scales, implementation=impl, block_k=block_k,
      split_tiles=split_tiles)
  want_o, want_m = reference_attention(*qargs, **kw, **scales)
  assert np.isfinite(f32(got_o)).all()
  assert_close(f32(got_o), want_o, jnp.bfloat16)
  assert_close(f32(got_m), want_m, jnp.bfloat16, table=MASS_TOL)
  # the 8-bit cache attends close to the bf16 one it was made from
  bf16_o = reference_attention(*args, **kw)[0]
  assert_close(f32(got_o), bf16_o, tol=dict(rtol=0.1, atol=0.1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_error_bound(request, fmt):
  x = _rng(request).standard_normal((2, 5, 3, 64)).astype(np.float32)
  x[0, 0, 0] = 0.0  # an all-zero vector keeps scale 1 and stays zero
  xq, scale = kv_quant.quantize(jnp.asarray(x), fmt)
  assert xq.dtype == jnp.dtype(fmt) and scale.shape == x.shape[:3]
  back = f32(kv_quant.dequantize(xq, scale))
  amax = np.abs(x).max(-1, keepdims=True)
  # e4m3: 3 mantissa bits (half an ulp 2^-4 relative, or the subnormal
  # step); int8: half a step of amax / 127; plus the scale's bf16 rounding.
  bound = (np.maximum(np.abs(x) / 15, amax / 448 * 2 ** -9) if fmt != "int8"
           else amax / 254 * 1.01)
  assert (np.abs(back - x) <= bound + 1e-6).all()
  assert (back[0, 0, 0] == 0).all() and float(scale[0, 0, 0]) == 1.0


def test_bad_scales_named():
  args, kw = inputs(np.random.default_rng(0), 1, 2, 2, 2, 64, 64, 0, [64],
                    [2], jnp.bfloat16, excl=False, score=False)
  qargs, scales = _quantized(args, "int8")
  with pytest.raises(ValueError, match="needs its k_scale"):
    api.scheduled_attention(*qargs, **kw)
  with pytest.raises(ValueError, match="scales given for a bfloat16"):
    api.scheduled_attention(*args, **kw, **scales)
