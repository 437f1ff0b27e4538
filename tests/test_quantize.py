"""8-bit weights: the formats' round trip, a quantized tiny model against
bf16, the 8-bit embedding's lookup, the scripts' flags and the dispatch by
rows (checkpoints, the CLI and bad inputs: test_quantize_load.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import quantize
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.forward import logits
from flash_dllm_jax.model import init_params, layerwise
from pallas_kernels.qmatmul.reference import dequantize

FORMATS = list(quantize.FORMATS)


def tree_equal(a, b) -> bool:
  """Same paths, dtypes and bits."""
  fa, fb = (quantize._flatten(t) for t in (a, b))
  return fa.keys() == fb.keys() and all(
      fa[k].dtype == fb[k].dtype and np.array_equal(
          np.asarray(fa[k]).view(np.uint8), np.asarray(fb[k]).view(np.uint8))
      for k in fa)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_is_within_half_a_step(fmt):
  """int8: |w - w_q * s| <= s / 2 (round to nearest); fp8 e4m3: within half
  an ulp of the scaled value (2^-4 relative for normals, 2^-10 * s below).
  A zero channel stays zero with scale 1; Z = E / 128 for int8-g128."""
  rng = np.random.default_rng(0)
  kernel_ExO = rng.standard_normal((256, 48)).astype(np.float32)
  kernel_ExO[:, 5] = 0.0
  kernel_ExO[:, 7] *= 1000.0  # a channel on another scale
  w_OxE, scale_OxZ = quantize.quantize_weight(kernel_ExO, fmt)
  f = quantize.FORMATS[fmt]
  assert w_OxE.shape == (48, 256) and w_OxE.dtype == f.dtype
  assert scale_OxZ.shape == (48, 2 if fmt == "int8-g128" else 1)
  assert scale_OxZ.dtype == jnp.float32
  back = np.asarray(dequantize(w_OxE, scale_OxZ)).T
  step = np.repeat(np.asarray(scale_OxZ), 256 // scale_OxZ.shape[1], 1).T
  err = np.abs(back - kernel_ExO)
  if fmt == "fp8":
    bound = np.maximum(np.abs(kernel_ExO) * 2.0 ** -4, step * 2.0 ** -10)
  else:
    bound = step / 2
  assert (err <= bound * (1 + 1e-6)).all(), (err / bound).max()
  assert (back[:, 5] == 0).all() and (np.asarray(scale_OxZ)[5] == 1).all()
  # absmax: the largest magnitude of each channel (group) is representable
  assert np.abs(np.asarray(w_OxE, np.float32)).max() == f.qmax


def _tiny_pair(fmt, head=False, arch="llada", embedding=False):
  config = ModelConfig.tiny(arch, d_model=128, n_heads=8, dtype="bfloat16")
  params = init_params(config, jax.random.key(3), head_init_scale=8.0)
  qconfig = config.replace(quantize=fmt, quantize_head=head,
                           quantize_embedding=embedding)
  return config, params, qconfig, quantize.quantize_params(params, qconfig)


@pytest.mark.parametrize("head,embedding", [(False, False), (True, True)],
                         ids=["projections", "head-embedding"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_tiny_model_logits_close_to_bf16(fmt, head, embedding):
  config, params, qconfig, qparams = _tiny_pair(fmt, head,
                                                embedding=embedding)
  ids = np.random.default_rng(1).integers(0, 380, (2, 24)).astype(np.int32)
  ref = logits(params, ids, config=config).logits_BxNxV
  got = logits(qparams, ids, config=qconfig).logits_BxNxV
  rel = float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref))
  assert 0 < rel < (0.08 if fmt == "fp8" else 0.02), rel
  # random weights: many near-ties among the top logits
  agree = float(jnp.mean(got.argmax(-1) == ref.argmax(-1)))
  assert agree >= (0.75 if fmt == "fp8" else 0.9), agree
  flat = quantize._flatten(qparams)
  assert ("lm_head/kernel_q" in flat) == head and ("lm_head" in flat) != head
  assert ("embed" in flat) != embedding
  if embedding:  # per row, in the head's format: Z = 1 whatever fmt's groups
    assert flat["embed/kernel_q"].shape == (config.vocab_size, 128)
    assert flat["embed/kernel_q"].dtype == quantize.FORMATS[fmt].dtype
    assert flat["embed/scale"].shape == (config.vocab_size, 1)
  else:
    assert flat["embed"].dtype == jnp.bfloat16
  # each quantized bf16 weight of O channels of E: 2 E O bytes -> E O + 4 O Z
  saved = 0
  for path, a in quantize._flatten(params).items():
    if quantize.quantizes(qconfig, path):
      o, e = a.shape if path == "embed" else a.shape[::-1]
      saved += a.size - 4 * o * quantize.scale_columns(
          quantize.leaf_format(qconfig, path), e)
  assert quantize.weight_bytes(qparams) == quantize.weight_bytes(params) - saved
  if embedding:  # the table takes V E + 4 V bytes instead of 2 V E
    v = config.vocab_size
    assert quantize.weight_bytes(quantize.quantize_params(
        params, qconfig.replace(quantize_embedding=False))) - (
            quantize.weight_bytes(qparams)) == (
            v * 128 - 4 * v)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_quantized_embedding_lookup_is_the_dequantized_rows_taken(fmt):
  """Both lookups (Transformer, layerwise.embed) give the rows of the
  dequantized table w.astype(f32) * scale, cast to bf16, bit for bit,
  without ever building that [V, E] table."""
  _, params, qconfig, qparams = _tiny_pair(fmt, head=True, embedding=True)
  table = qparams["embed"]
  dequantized_VxE = table["kernel_q"].astype(jnp.float32) * table["scale"]
  ids = np.random.default_rng(1).integers(0, 384, (2, 24)).astype(np.int32)
  want = jnp.take(dequantized_VxE, ids, axis=0).astype(jnp.bfloat16)
  got = layerwise.embed(qconfig, qparams, ids)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))
  assert not np.array_equal(np.asarray(got, np.float32), np.asarray(
      jnp.take(params["embed"], ids, axis=0), np.float32))  # 8 bits moved it
  jaxpr = jax.make_jaxpr(lambda p: layerwise.embed(qconfig, p, ids))(qparams)
  shapes = [v.aval.shape for e in jaxpr.eqns for v in e.outvars]
  assert (qconfig.vocab_size, 128) not in shapes, shapes
  # the Transformer looks up the same rows: logits equal those of the f32
  # dequantized table stored as a plain embedding
  plain = {**qparams, "embed": dequantized_VxE}
  np.testing.assert_array_equal(
      logits(qparams, ids, config=qconfig).logits_BxNxV,
      logits(plain, ids, config=qconfig.replace(
          quantize_embedding=False)).logits_BxNxV)


def test_init_params_of_a_quantized_config_quantizes_the_bf16_init():
  config, params, qconfig, qparams = _tiny_pair("int8", head=True,
                                                embedding=True)
  assert tree_equal(init_params(qconfig, jax.random.key(3),
                                head_init_scale=8.0), qparams)



@pytest.mark.slow
def test_bench_strategies_and_quant_error_take_quantize(tmp_path, capsys):
  """bench_strategies quantizes its random weights and records their bytes;
  quant_error prints its tables for the shipped model. Both mains run in
  this process (no fresh Python and JAX import each)."""
  import importlib
  import json
  import sys
  from tests.paths import ROOT
  if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
  out = tmp_path / "bench.json"
  importlib.import_module("bench_strategies").main([
      "--smoke", "--quantize", "fp8", "--only", "flash-dllm", "--json",
      str(out)])
  printed = capsys.readouterr().out
  doc = json.loads(out.read_text())
  assert doc["quantize"] == "fp8" and 0 < doc["weight_bytes"]
  assert "weights in memory" in printed and len(doc["rows"]) == 1
  # W8A8 projections are fp8 x fp8 GEMMs: fp8's rate is the compute ceiling
  assert doc["matmul_kind"] == "fp8" and doc["matmul_flops"] > 0
  assert "fp8 matmul" in printed
  assert importlib.import_module("quant_error").main([
      "--smoke", "--batch", "1", "--formats", "int8", "fp8"]) == 0
  printed = capsys.readouterr().out
  assert "| fp8 |" in printed and "| int8 |" in printed
  assert "| 9 |" in printed  # a row per layer of the 10-layer model


def test_dispatch_picks_the_kernel_by_rows_per_sequence_never_the_batch(
    monkeypatch):
  """On a GPU ('pallas'), Q <= ops.stream_max_q(format) streams the
  weights and larger Q goes to XLA, whatever the batch; each call here still
  runs the reference (recorded on its way), which gives every row the same
  bits whatever the batch."""
  from flash_dllm_jax import ops
  from pallas_kernels.qmatmul import api, reference
  chosen = []

  def recording(*args, implementation=None, **kwargs):
    chosen.append(implementation)
    return reference.matmul(*args, **kwargs)

  monkeypatch.setattr(api, "matmul", recording)
  w_OxE, scale_OxZ = quantize.quantize_weight(
      np.random.default_rng(0).standard_normal((128, 32)), "int8")
  limit = ops.QMATMUL_STREAM_MAX_Q
  x = jnp.asarray(np.random.default_rng(1).standard_normal((64, 2 * limit,
                                                            128)), jnp.float32)
  for b, q, want in [(1, limit, "pallas"), (64, limit, "pallas"),
                     (1, limit + 1, "xla"), (64, 2 * limit, "xla")]:
    y = ops.quantized_linear(x[:b, :q], w_OxE, scale_OxZ, fmt="int8",
                             implementation="pallas")
    assert chosen[-1] == want, (b, q, chosen)
    ops.quantized_linear(x[:b, :q], w_OxE, scale_OxZ, fmt="int8",
                         implementation=ops.Kernels(
                             "pallas", stream_max_q=2 * limit))
    assert chosen[-1] == "pallas"  # a benchmark's setting moves the line
    np.testing.assert_array_equal(
        y[:1], ops.quantized_linear(x[:1, :q], w_OxE, scale_OxZ, fmt="int8",
                                    implementation="pallas"))
  # W8A8 takes XLA's fp8 GEMM at every Q unless a setting says otherwise.
  w8_OxE, s8_OxZ = quantize.quantize_weight(
      np.random.default_rng(0).standard_normal((128, 32)), "fp8")
  assert ops.stream_max_q("fp8") == ops.QMATMUL_W8A8_STREAM_MAX_Q == 0
  for kernels, want in [("pallas", "xla"),
                        (ops.Kernels("pallas", stream_max_q=limit), "pallas")]:
    ops.quantized_linear(x[:1, :1], w8_OxE, s8_OxZ, fmt="fp8",
                         implementation=kernels)
    assert chosen[-1] == want, (kernels, chosen)


def test_kernels_qmatmul_mosaic_streams_through_mosaic_gpu(monkeypatch):
  """Kernels(qmatmul="mosaic") sends the streamed rows to Mosaic GPU's kernel
  (its interpret mode under "pallas_interpret": the api's own result, bit
  for bit), XLA's GEMM above the line as before; other names are refused."""
  from flash_dllm_jax import ops
  from pallas_kernels.qmatmul import api
  w_OxE, scale_OxZ = quantize.quantize_weight(  # [E, O] in, [O, E] out
      np.random.default_rng(0).standard_normal((256, 128)), "int8")
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 256)),
                  jnp.bfloat16)
  kernels = ops.Kernels("pallas_interpret", qmatmul="mosaic")
  got = ops.quantized_linear(x, w_OxE, scale_OxZ, fmt="int8",
                             implementation=kernels)
  want = api.matmul(x.reshape(16, 256), w_OxE, scale_OxZ,
                    implementation="mosaic_interpret").reshape(2, 8, 128)
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))
  chosen = []
  real = api.matmul
  monkeypatch.setattr(api, "matmul", lambda *a, implementation=None, **k: (
      chosen.append(implementation), real(*a, **k, implementation="xla"))[1])
  limit = ops.QMATMUL_STREAM_MAX_Q
  big = jnp.zeros((1, limit + 1, 256), jnp.bfloat16)
  for xs, want_impl in [(x, "mosaic"), (big, "xla")]:
    ops.quantized_linear(xs, w_OxE, scale_OxZ, fmt="int8",
                         implementation=ops.Kernels("pallas",
                                                    qmatmul="mosaic"))
    assert chosen[-1] == want_impl
  with pytest.raises(ValueError, match="qmatmul must be one of"):
    ops.Kernels(qmatmul="cutlass")


def test_bench_params_quantized_leaf_by_leaf_equal_quantize_params():
  from flash_dllm_bench import timing
  config = ModelConfig.tiny("llada", d_model=128, n_heads=8, dtype="bfloat16")
  assert tree_equal(
      timing.bench_params(config, quantize="int8-g128", quantize_head=True,
                          quantize_embedding=True),
      quantize.quantize_params(timing.bench_params(config), config.replace(
          quantize="int8-g128", quantize_head=True, quantize_embedding=True)))
