"""scripts/probe_row_invariance.py on the tiny checkpoint: the report's
structure, no difference between identical batches, and a planted difference
(one norm scale changed in batch B's weights) found at its layer. Both
batches have one shape, so the programs compile once (the test stays fast)."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.generate import CPU_COMPILER_OPTIONS
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests.paths import ROOT, TINY_CHECKPOINT

_spec = importlib.util.spec_from_file_location(
    "probe_row_invariance", ROOT / "scripts" / "probe_row_invariance.py")
probe_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe_mod)

# Mass from layer 1 of the tiny model's 2 (the default, 2, would sow none).
SAMPLER = FlashDLLMSampler(gen_length=16, block_m=4, track_num=2, mask_num=2,
                           mass_from_layer=1)
OPTS = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None


@pytest.fixture(scope="module")
def tiny():
  params, config, tok = load(TINY_CHECKPOINT)
  rows = probe_mod.bucket_rows(tok, config, ROOT / "data" / "synthetic_gsm", 4)
  return params, config, rows


def _side(params, config, rows):
  return probe_mod.side(params, config, SAMPLER, *rows, opts=OPTS)


def test_bucket_rows_and_diff(tiny):
  _, config, (ids, valid, seeds) = tiny
  assert ids.shape[0] == 4 and ids.shape[1] % 32 == 0 and len(set(seeds)) == 4
  assert valid[:, -1].all() and (ids[~valid] == config.pad_token_id).all()
  x = jnp.ones((3, 4), jnp.bfloat16)
  assert probe_mod.diff(x, x.at[2, 0].set(2), 2) == (0, 0.0)  # row 2 not shared
  assert probe_mod.diff(x, x.at[1, 0].set(2), 2) == (1, 1.0)
  assert probe_mod.diff(x, x.at[1, 0].set(1.0078125), 2)[0] == 1  # one ulp


def test_bucket_rows_picks_the_bucket_holding_a_problem(tiny):
  _, config, _ = tiny
  _, _, tok = load(TINY_CHECKPOINT)
  data = ROOT / "data" / "synthetic_gsm"
  largest = probe_mod.bucket_rows(tok, config, data, 1000, limit=128)[2]
  other = next(i for i in range(128) if i not in set(largest))
  ids, _, seeds = probe_mod.bucket_rows(tok, config, data, 1000, limit=128,
                                        with_index=other)
  assert other in seeds and not set(seeds) & set(largest)
  assert len(seeds) + len(largest) <= 128
  with pytest.raises(ValueError, match="not among the first 128"):
    probe_mod.bucket_rows(tok, config, data, 8, limit=128, with_index=500)


def test_identical_batches_report_no_difference(tiny):
  params, config, rows = tiny
  a, b = _side(params, config, rows), _side(params, config, rows)
  logs = []
  report = probe_mod.probe(a, b, 4, [1, 2, SAMPLER.num_steps], log=logs.append)
  assert [s["k"] for s in report["steps"]][:2] == [1, 2]
  assert report["steps"][0]["ran"] == (1, 1)
  assert all(s["diff"] == {} for s in report["steps"])
  assert report["first_diff_step"] is None and report["pieces"] is None
  assert "no difference" in logs[-1]
  # The pieces of a flash step (the prefill's: next test): all present, in
  # execution order, and equal.
  pa, pb = a[1](a[0](1), False), b[1](b[0](1), False)
  names = [key[5:] for key in sorted(pa)]
  assert names[:3] == ["selection: query slots", "embedding", "L0 attn_norm"]
  for piece in ("L0 rope+cache write: k cache", "L1 attention (kernel) out",
                "L1 attention mass", "L1 silu(gate) * up", "L1 block out",
                "final norm", "logits", "confidence", "step['tokens_BxN']"):
    assert piece in names, piece
  assert "L0 attention mass" not in names  # mass_from_layer=1
  assert names.index("L0 q_proj") < names.index("L0 attn_out") < names.index(
      "L1 attn_norm") < names.index("logits")
  assert all(probe_mod.diff(pa[key], pb[key], 4)[0] == 0 for key in pa)


def test_a_planted_difference_is_found_at_its_layer(tiny):
  params, config, rows = tiny
  params_b = jax.tree.map(lambda x: x, params)
  scale = params["layers_1"]["mlp_norm"]["scale"]
  params_b["layers_1"]["mlp_norm"]["scale"] = scale * 1.5
  a, b = _side(params, config, rows), _side(params_b, config, rows)
  report = probe_mod.probe(a, b, 4, [1, 2], log=lambda s: None)
  assert report["first_diff_step"] == 1
  diff_1 = report["steps"][0]["diff"]
  # The last layer's MLP feeds only the logits: ranks differ, K/V and mass not.
  assert ".aux.rank_BxN" in diff_1 and ".aux.mass_BxN" not in diff_1
  assert not any("cache" in leaf for leaf in diff_1)
  assert report["first_piece"] == "L1 mlp_norm"
  first = next(r for r in report["pieces"] if r["diff"])
  assert first["piece"] == "L1 mlp_norm" and first["max_abs"] > 0
  assert any(r["piece"].startswith("step") and r["diff"]
             for r in report["pieces"])
